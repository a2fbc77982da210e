"""Test infrastructure that reproduces a shared filesystem's bad days for real (docs/design.md §9).

- :mod:`.faultfs`: the FUSE fault filesystem (its own process) and its control protocol;
- :mod:`.faults`, :mod:`.quota`: its fault rules and its Lustre-like quota;
- :mod:`.faultctl`: the control client; :mod:`.faultmount`: start and stop the process;
- :mod:`.journal`: the fault filesystem's ordered record of the calls that change or sync;
- :mod:`.durability`: assertions over that record: fsynced, and in the order a crash needs;
- :mod:`.tmpfs`: tiny tmpfs mounts and helpers that fill them;
- :mod:`.mountinfo`: mount-table checks that never touch a (possibly hung) mount;
- :mod:`.capability`: whether this machine can mount, and skip-or-fail when it cannot;
- :mod:`.fakes`: the fake `lfs`; :mod:`.mutation`: the mutation runner.

What each module gives a test: ``tests/support/README.md``.

The pytest fixtures built on these are in ``tests/conftest.py``.
"""
