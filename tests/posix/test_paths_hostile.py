"""Paths a neighbour can choose: symlink loops, empty names, newlines and bytes that are not
UTF-8. Each is judged as what it is and shown so that it cannot be mistaken for another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsprobe.posix.paths import escaped
from tests.redirect.test_redirect_sync import Setup, _sync_on_a_terminal
from tests.support.daemon_process import clean_environment

FSPROBE = [sys.executable, "-m", "fsprobe"]


def fsprobe(*args: str | bytes, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*FSPROBE, *args],
        capture_output=True,
        timeout=60,
        env=env or clean_environment(),
    )


def unescape(text: str) -> str:
    """The inverse of `escaped`, written here from its rules: a round trip proves injectivity."""
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        kind = text[index + 1]
        if kind in "\\ntr":
            out.append({"\\": "\\", "n": "\n", "t": "\t", "r": "\r"}[kind])
            index += 2
        elif kind == "x":
            code = int(text[index + 2 : index + 4], 16)
            out.append(chr(code if code < 0x80 else 0xDC00 + code))
            index += 4
        else:
            assert kind == "u"
            out.append(chr(int(text[index + 2 : index + 6], 16)))
            index += 6
    return "".join(out)


_TRICKY = st.sampled_from(["\\", "x", "n", "ff", "\n", "\t", "\x1b", "\x7f", "\x9b", "é", "/"])
_UNDECODABLE = st.integers(0x80, 0xFF).map(lambda byte: chr(0xDC00 + byte))


@given(st.lists(st.one_of(_TRICKY, _UNDECODABLE, st.characters(max_codepoint=0xD7FF))))
def test_escaping_is_printable_utf8_and_reversible(parts):
    path = "".join(parts)
    shown = escaped(path)
    assert unescape(shown) == path  # so two different paths never show the same
    assert not [c for c in shown if unicodedata.category(c) == "Cc"]  # no newline, ESC, C1
    shown.encode("utf-8")  # a label value Prometheus accepts


def test_a_symlink_loop_is_an_error_of_the_target_not_judged_by_its_parent(tmp_path):
    loop = tmp_path / "ckpt"
    loop.symlink_to("ckpt")
    result = fsprobe("check", str(loop), "--json", "--no-quota")
    report = json.loads(result.stdout)
    assert report["probes"]["statvfs"]["error"] == "ELOOP"
    assert report["status"] == "unhealthy" and result.returncode == 2
    assert os.listdir(tmp_path) == ["ckpt"]  # the write probe wrote nothing in the parent


def test_a_target_that_does_not_exist_yet_is_still_judged_by_its_parent(tmp_path):
    result = fsprobe("check", str(tmp_path / "new" / "ckpt"), "--json", "--no-quota")
    assert json.loads(result.stdout)["probes"]["statvfs"]["ok"] is True


@pytest.mark.parametrize(
    "args",
    [
        ("check", ""),
        ("quota", ""),
        ("run", "--once", ""),
        ("sync", "--fallback-dir", ""),
    ],
)
def test_an_empty_path_is_refused_not_taken_for_the_working_directory(tmp_path, args):
    result = fsprobe(*args, env=clean_environment(FSPROBE_STATE_DIR=str(tmp_path / "state")))
    assert result.returncode == 64, result.stderr
    assert b"empty path" in result.stderr or b"not a directory name: ''" in result.stderr
    assert not (tmp_path / "state" / "state.json").exists()


def test_a_newline_in_a_path_cannot_break_the_table(tmp_path):
    target = tmp_path / "evil\nOK  fake line"
    target.mkdir()
    result = fsprobe(
        "check", str(target), "--no-quota", env=clean_environment(TMPDIR=str(tmp_path))
    )
    lines = result.stdout.decode().splitlines()
    assert "evil\\nOK  fake line" in lines[0]
    assert not any(line.startswith("OK  fake line") for line in lines)


def test_paths_that_differ_only_in_undecodable_bytes_keep_distinct_series(tmp_path):
    first, second = os.fsencode(tmp_path) + b"/ckpt\xff", os.fsencode(tmp_path) + b"/ckpt\xfe"
    os.mkdir(first)
    os.mkdir(second)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    result = fsprobe(
        "run", "--once", "--textfile-dir", str(textfiles),
        "--state-dir", str(tmp_path / "state"), first, second,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    health = [
        line
        for line in (textfiles / "fsprobe.prom").read_text("utf-8").splitlines()
        if line.startswith("fsprobe_health_status{")
    ]
    assert len(health) == 2
    assert any("ckpt\\\\xff" in line for line in health)
    assert any("ckpt\\\\xfe" in line for line in health)


def test_a_newline_in_a_redirected_path_cannot_forge_a_line_of_sync(tmp_path):
    """`fsprobe sync` escaped the requested path but printed each outcome's message as it
    came, and messages name paths: a checkpoint directory with a newline in its name forged
    a line of root's human output (the daemon's log escaped it)."""
    forged = "synced            model.pt"
    setup = Setup(tmp_path)
    setup.target = tmp_path / f"evil\n{forged}"
    setup.target.mkdir()
    result = setup.save_redirected({"epoch": 1})
    os.unlink(result.path)  # the copy is gone: the message names it
    done = fsprobe(
        "sync", "--fallback-dir", str(setup.fallback), "--state-dir", str(setup.state),
        env=clean_environment(TMPDIR=str(tmp_path)),
    )  # fmt: skip
    lines = done.stdout.decode().splitlines()
    assert any(line.startswith("missing") for line in lines), lines
    assert not any(line.lstrip().startswith(forged) for line in lines), lines
    assert sum(f"evil\\n{forged}" in line for line in lines) == 2, lines  # path and message


def test_nothing_to_sync_names_the_fallback_dirs_escaped(tmp_path):
    fallback = tmp_path / "fallback\nOK  fake line"
    fallback.mkdir()
    done = fsprobe("sync", "--fallback-dir", str(fallback))
    lines = done.stdout.decode().splitlines()
    assert lines == [f"nothing to sync in {tmp_path}/fallback\\nOK  fake line"], lines


def test_a_path_on_the_progress_line_cannot_drive_the_terminal(faultfs, tmp_path):
    """The progress line of a long copy back names the checkpoint, redrawn in place on the
    person's terminal: a directory named with a hyperlink (OSC 8), a window title, a return
    and a line erase is shown as escaped text, and the only control sequence the terminal gets
    is the meter's own redraw."""
    hostile = "x\x1b]8;;https:evil.example\x07click\x1b]8;;\x07\x1b]0;owned\x07\r\x1b[2Kok"
    setup = Setup(tmp_path)
    setup.fallback = faultfs.mountpoint
    setup.target = tmp_path / hostile
    setup.target.mkdir()
    faultfs.ctl.delay("read", 0.02, path="/uid-*")  # a slow fallback: the copy takes seconds
    setup.save_redirected(b"z" * (16 << 20), name="big.pt")
    status, out, shown = _sync_on_a_terminal(setup)
    assert status == 0 and "synced" in out
    frames = [frame for frame in shown.split("\r\x1b[K") if frame]
    assert frames and all(escaped(hostile) in frame for frame in frames), shown
    assert not any(character in "".join(frames) for character in "\x1b\x07\r"), shown
