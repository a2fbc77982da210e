"""Running `fsprobe` subcommands in the test process, with stdout and stderr kept apart."""

from __future__ import annotations

from click.testing import CliRunner


def cli_runner() -> CliRunner:
    """A CliRunner whose results have separate `stdout` and `stderr` on every click version.

    click < 8.2 (the last for Python 3.9) mixes stderr into stdout unless told not to; click
    >= 8.2 keeps them apart and no longer has the argument.
    """
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()
