"""`fsprobe.atomic_write` / `fsprobe.save` on a local directory: the sequence, the classification
of failures, retries with backoff, and what a caller gets back (no mounts needed here)."""

from __future__ import annotations

import errno
import io
import os
import pickle
import random
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

import fsprobe
from fsprobe.posix.atomic import parse_temp_name
from fsprobe.saving.file import AtomicFile
from fsprobe.saving.options import Backoff
from fsprobe.saving.retry import FailedAttempt, SaveError


def quick(sleeps: list[float] | None = None) -> Backoff:
    """A backoff that records its sleeps in `sleeps` instead of sleeping."""
    return Backoff(sleep=(sleeps if sleeps is not None else []).append)


def failing_writer(errors: list[int | None], content: bytes = b"checkpoint"):
    """A writer whose n-th call raises errors[n] (after writing a little), then succeeds."""
    calls = []

    def write(stream: AtomicFile) -> None:
        calls.append(stream.name)
        stream.write(content[:3])
        if len(calls) <= len(errors):
            code = errors[len(calls) - 1]
            raise OSError(code, os.strerror(code)) if code else OSError("no errno")
        stream.write(content[3:])

    write.calls = calls
    return write


def model_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    return model.state_dict()


def assert_same_state(loaded, original) -> None:
    assert loaded.keys() == original.keys()
    for key in original:
        assert torch.equal(loaded[key], original[key]), key


def only_files(directory) -> list[str]:
    return sorted(os.listdir(directory))


def test_save_writes_a_loadable_checkpoint_and_leaves_nothing_else(tmp_path):
    state = model_state()
    result = fsprobe.save(state, tmp_path / "model.pt")
    assert result.path == result.requested_path == str(tmp_path / "model.pt")
    assert not result.redirected and result.attempts == 1 and result.errors == ()
    assert result.bytes == os.path.getsize(tmp_path / "model.pt") > 0
    assert result.seconds > 0
    assert_same_state(torch.load(tmp_path / "model.pt"), state)
    assert only_files(tmp_path) == ["model.pt"]


def test_temp_file_is_hidden_beside_the_target_and_gets_the_umask_mode(tmp_path):
    seen = {}

    def write(stream: AtomicFile) -> None:
        seen["temp"] = stream.name
        seen["listing"] = os.listdir(tmp_path)
        seen["mode"] = stat.S_IMODE(os.stat(stream.name).st_mode)
        stream.write(b"x" * 100)

    old = os.umask(0o002)
    try:
        fsprobe.atomic_write(tmp_path / "ckpt.pt", write)
    finally:
        os.umask(old)
    name = os.path.basename(seen["temp"])
    assert os.path.dirname(seen["temp"]) == str(tmp_path)
    assert name.startswith(".") and name.endswith(".tmp")
    assert parse_temp_name(name).base == "ckpt.pt" and parse_temp_name(name).pid == os.getpid()
    assert seen["listing"] == [name]
    assert seen["mode"] == 0o664  # 0o666 & ~umask: what the checkpoint keeps after the rename
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt.pt").st_mode) == 0o664


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ETIMEDOUT, None])
def test_transient_failures_are_retried_after_a_backoff(tmp_path, code):
    sleeps: list[float] = []
    write = failing_writer([code, code])
    result = fsprobe.atomic_write(tmp_path / "ckpt", write, backoff=quick(sleeps))
    name = errno.errorcode[code] if code else "EUNKNOWN"
    assert result.attempts == 3 and result.errors == (name, name)
    assert (tmp_path / "ckpt").read_bytes() == b"checkpoint"
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 2.0 and 0 <= sleeps[1] <= 4.0
    assert len(set(write.calls)) == 3  # a fresh temp file each attempt
    assert only_files(tmp_path) == ["ckpt"]


def test_a_retried_save_leaves_the_random_state_of_the_training_alone(tmp_path):
    """Trainers save and restore the `random` module's state with each checkpoint (Accelerate,
    the Hugging Face Trainer): the jitter of a retry draws elsewhere, or a retried save would
    change the run (found as a resumed Accelerate run that drew other numbers)."""
    random.seed(7)
    before = random.getstate()
    sleeps: list[float] = []
    write = failing_writer([errno.EIO, errno.EIO])
    result = fsprobe.atomic_write(tmp_path / "ckpt", write, backoff=quick(sleeps))
    assert result.attempts == 3 and len(sleeps) == 2 and len(set(sleeps)) == 2
    assert random.getstate() == before


def test_every_attempt_failing_raises_save_error_and_keeps_the_previous_file(tmp_path):
    (tmp_path / "ckpt").write_bytes(b"previous")
    sleeps: list[float] = []
    with pytest.raises(SaveError) as raised:
        fsprobe.atomic_write(
            tmp_path / "ckpt", failing_writer([errno.EIO] * 9), attempts=4, backoff=quick(sleeps)
        )
    error = raised.value
    assert isinstance(error, OSError) and error.errno == errno.EIO
    assert error.filename == str(tmp_path / "ckpt")
    assert [a.errno for a in error.attempts] == ["EIO"] * 4
    assert all(a.step == "write" for a in error.attempts)
    assert len(sleeps) == 3
    assert (tmp_path / "ckpt").read_bytes() == b"previous"
    assert only_files(tmp_path) == ["ckpt"]


def test_permanent_failure_without_fallback_raises_at_once(tmp_path):
    sleeps: list[float] = []
    with pytest.raises(SaveError) as raised:
        fsprobe.atomic_write(
            tmp_path / "ckpt", failing_writer([errno.EACCES]), backoff=quick(sleeps)
        )
    assert raised.value.errno == errno.EACCES
    assert raised.value.attempts == [
        FailedAttempt("EACCES", "write", "[Errno 13] Permission denied")
    ]
    assert sleeps == []


def test_missing_directory_is_a_permanent_create_failure(tmp_path):
    with pytest.raises(SaveError) as raised:
        fsprobe.atomic_write(tmp_path / "no" / "ckpt", lambda f: f.write(b"x"), backoff=quick())
    assert raised.value.errno == errno.ENOENT
    assert raised.value.attempts[0].step == "create"


def test_capacity_failure_without_fallback_is_retried(tmp_path):
    sleeps: list[float] = []
    result = fsprobe.atomic_write(
        tmp_path / "ckpt", failing_writer([errno.EDQUOT]), backoff=quick(sleeps)
    )
    assert result.errors == ("EDQUOT",) and result.attempts == 2 and len(sleeps) == 1


def test_a_bug_in_the_writer_is_raised_as_it_is_without_retry(tmp_path):
    (tmp_path / "ckpt").write_bytes(b"previous")
    sleeps: list[float] = []

    def write(stream):
        stream.write(b"half")
        raise pickle.PicklingError("cannot pickle a lambda")

    with pytest.raises(pickle.PicklingError):
        fsprobe.atomic_write(tmp_path / "ckpt", write, backoff=quick(sleeps))
    assert sleeps == []
    assert only_files(tmp_path) == ["ckpt"]
    assert (tmp_path / "ckpt").read_bytes() == b"previous"


class FailingStream:
    """Passes writes on to the real file object but fails the n-th with EIO, as a filesystem
    would; torch then surfaces its own RuntimeError with the OSError only in __context__."""

    def __init__(self, stream, fail_at: int) -> None:
        self.stream, self.fail_at, self.calls = stream, fail_at, 0

    def write(self, data):
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(errno.EIO, "Input/output error")
        return self.stream.write(data)

    def flush(self):
        self.stream.flush()


def test_torch_secondary_error_is_seen_through_to_the_errno(tmp_path):
    state = model_state()
    with pytest.raises(RuntimeError, match="unexpected pos") as surfaced:
        torch.save(state, FailingStream(io.BytesIO(), fail_at=2))
    assert isinstance(surfaced.value.__context__, OSError)  # what torch does: the premise

    attempts = []

    def write(stream):
        attempts.append(stream)
        torch.save(state, FailingStream(stream, fail_at=2) if len(attempts) == 1 else stream)

    result = fsprobe.atomic_write(tmp_path / "model.pt", write, backoff=quick())
    assert result.errors == ("EIO",) and result.attempts == 2
    assert_same_state(torch.load(tmp_path / "model.pt"), state)


@pytest.mark.parametrize(
    ("failure", "counted_as"),
    [
        # torch given a path: no errno at all, transient
        (RuntimeError("[enforce fail at inline_container.cc:672] . file write failed"), "EUNKNOWN"),
        # safetensors (Rust): an exception of its own, the errno only in its message
        (Exception("Error while serializing: I/O error: Input/output error (os error 5)"), "EIO"),
        # torch given a path it cannot open (torch 2.x inline_container.cc): the strerror text
        (
            RuntimeError(
                "[enforce fail at inline_container.cc:747] . open file failed with strerror: "
                "Input/output error"
            ),
            "EIO",
        ),
        (RuntimeError("open file failed because of errno 5 on fopen: x, file path: y"), "EIO"),
    ],
)
def test_a_write_failure_without_an_oserror_is_retried_as_what_it_says(
    tmp_path, failure, counted_as
):
    calls = []

    def write(stream):
        calls.append(1)
        if len(calls) == 1:
            raise failure
        stream.write(b"ok")

    result = fsprobe.atomic_write(tmp_path / "ckpt", write, backoff=quick())
    assert result.errors == (counted_as,) and result.attempts == 2


def test_backoff_is_exponential_with_full_jitter_and_capped():
    top = Backoff(random=lambda: 1.0)
    assert [top.delay(n) for n in range(1, 6)] == [2.0, 4.0, 8.0, 15.0, 15.0]
    assert sum(top.delay(n) for n in range(1, 5)) == 29.0  # 5 attempts: about 30 s at most
    assert Backoff(random=lambda: 0.0).delay(3) == 0.0
    assert Backoff(base=0.1, cap=1.0, random=lambda: 0.5).delay(10) == 0.5


def test_save_error_survives_pickling_with_its_attempts(tmp_path):
    error = SaveError("/ckpt/x.pt", [FailedAttempt("EIO", "write", "boom")], "saving failed")
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, SaveError)
    assert (copy.errno, copy.filename, copy.attempts) == (errno.EIO, "/ckpt/x.pt", error.attempts)


def test_unsynced_save_still_replaces_atomically(tmp_path):
    result = fsprobe.atomic_write(tmp_path / "ckpt", lambda f: f.write(b"abc"), fsync=False)
    assert result.bytes == 3 and (tmp_path / "ckpt").read_bytes() == b"abc"


def test_relative_path_is_saved_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = fsprobe.save({"step": 3}, "rel.pt")
    assert result.path == str(tmp_path / "rel.pt")
    assert torch.load(tmp_path / "rel.pt") == {"step": 3}


def test_importing_fsprobe_imports_no_framework():
    code = (
        "import sys, fsprobe\n"
        "heavy = [m for m in ('torch', 'lightning', 'transformers') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_saves_leave_no_descriptor_open_whether_they_succeed_or_fail(tmp_path):
    """A trainer saves every few minutes for weeks: one descriptor per save would run out."""

    def fails(stream):
        stream.write(b"half")
        raise OSError(errno.EIO, "injected")

    # The first save may start the probe worker of its inline preflight, which stays for the
    # life of the process (once, not per save): started before counting.
    fsprobe.atomic_write(tmp_path / "ckpt", lambda stream: stream.write(b"first"))
    before = set(os.listdir("/proc/self/fd"))
    kept = []  # a trainer may keep its errors to report them later: they hold no descriptor
    for step in range(3):
        fsprobe.atomic_write(tmp_path / "ckpt", lambda stream, n=step: stream.write(b"x" * n))
        with pytest.raises(fsprobe.SaveError) as failed:
            fsprobe.atomic_write(tmp_path / "other", fails, attempts=1)
        kept.append(failed.value)
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_process_without_stdin_closes_a_temp_file_that_got_descriptor_0(tmp_path):
    """A daemon started with its standard input closed gets descriptor 0 for the first file it
    opens: a save must close that one too (0 is free again after it)."""
    code = textwrap.dedent(
        """
        import os, sys
        import fsprobe
        fsprobe.atomic_write(sys.argv[1] + "/first", lambda f: f.write(b"1"))  # the worker
        os.close(0)
        fsprobe.atomic_write(sys.argv[1] + "/ckpt", lambda f: f.write(b"x"), preflight=False)
        print(os.open(os.devnull, os.O_RDONLY))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["0"]
    assert (tmp_path / "ckpt").read_bytes() == b"x"
