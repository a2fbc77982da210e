"""The state file's reader: trust checks, corrupt files, and the parse cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fsprobe.state import (
    STATE_FILE,
    CorruptStateFile,
    StateReader,
    UntrustedStateFile,
    write_state,
    write_state_targets,
)

NOBODY = 65534


def document(**targets: dict) -> dict:
    return {"generated_at": 1_700_000_000.0, "host": "h", "pid": 1, "targets": targets}


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    write_state(str(directory), document(**{"/ckpt": {"status": "ok"}}))
    return directory


def test_a_file_written_by_write_state_is_trusted_and_parsed(state_dir):
    state = StateReader(str(state_dir)).read()
    assert state.document["schema"] == 1
    assert state.targets == {"/ckpt": {"status": "ok"}}
    assert state.generated_at == 1_700_000_000.0
    assert oct(os.stat(state_dir).st_mode & 0o777) == oct(0o755)
    assert oct(os.stat(state_dir / STATE_FILE).st_mode & 0o777) == oct(0o644)


def test_no_state_file_is_none_not_an_error(tmp_path):
    assert StateReader(str(tmp_path / "nothing")).read() is None


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_file_writable_by_group_or_others_is_refused(state_dir, mode):
    os.chmod(state_dir / STATE_FILE, mode)
    with pytest.raises(UntrustedStateFile, match="writable by group or others"):
        StateReader(str(state_dir)).read()


def test_a_directory_writable_by_others_is_refused(state_dir):
    os.chmod(state_dir, 0o777)
    with pytest.raises(UntrustedStateFile, match=r"state directory .* writable by group"):
        StateReader(str(state_dir)).read()


def test_a_file_owned_by_another_user_is_refused(state_dir):
    if os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(state_dir / STATE_FILE, NOBODY, NOBODY)
    with pytest.raises(UntrustedStateFile, match=f"belongs to uid {NOBODY}, not to you"):
        StateReader(str(state_dir)).read()


def test_a_directory_owned_by_another_user_is_refused(state_dir):
    if os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(state_dir, NOBODY, NOBODY)
    with pytest.raises(UntrustedStateFile, match="state directory"):
        StateReader(str(state_dir)).read()


def test_writing_into_a_directory_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UntrustedStateFile, match=f"belongs to uid {NOBODY}"):
        write_state(str(planted), document())
    assert not (planted / STATE_FILE).exists()


def test_a_symlink_in_place_of_the_file_is_refused(state_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"schema": 1, "targets": {}}))
    (state_dir / STATE_FILE).unlink()
    (state_dir / STATE_FILE).symlink_to(elsewhere)
    with pytest.raises(UntrustedStateFile):
        StateReader(str(state_dir)).read()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"schema": 1, "generated_at": 17000', "not valid JSON"),  # truncated
        (b"", "not valid JSON"),
        (b"\x00\xff garbage", "not valid JSON"),
        (b'{"schema": 2, "targets": {}}', "has schema 2"),
        (b'["schema", 1]', "has schema None"),
        (b'{"schema": 1, "targets": []}', "'targets' is not an object"),
    ],
)
def test_a_corrupt_file_is_reported_with_the_reason(state_dir, content, message):
    path = state_dir / STATE_FILE
    path.write_bytes(content)
    with pytest.raises(CorruptStateFile, match=message):
        StateReader(str(state_dir)).read()


def test_the_parse_is_cached_until_the_file_changes(state_dir):
    reader = StateReader(str(state_dir))
    first = reader.read()
    assert reader.read() is first
    write_state(str(state_dir), document(**{"/other": {"status": "degraded"}}))
    second = reader.read()
    assert second is not first and list(second.targets) == ["/other"]
    assert reader.read() is second


def test_a_trust_change_is_noticed_even_with_a_cached_parse(state_dir):
    reader = StateReader(str(state_dir))
    reader.read()
    os.chmod(state_dir / STATE_FILE, 0o666)
    with pytest.raises(UntrustedStateFile):
        reader.read()


def test_target_for_picks_the_closest_watched_ancestor(state_dir):
    write_state(
        str(state_dir),
        document(**{"/ckpt": {"status": "ok"}, "/ckpt/run1": {"status": "degraded"}}),
    )
    state = StateReader(str(state_dir)).read()
    assert state.target_for("/ckpt/run1/epoch-3")[0] == "/ckpt/run1"
    assert state.target_for("/ckpt/run10")[0] == "/ckpt"
    assert state.target_for("/ckpt")[0] == "/ckpt"
    assert state.target_for("/elsewhere") is None


def test_write_state_targets_writes_the_same_document_as_write_state(tmp_path):
    targets = {"/ckpt": {"status": "ok", "path": "/ckpt"}, '/we"ird\\ü': {"status": "degraded"}}
    header = {"generated_at": 1.5, "host": "h", "pid": 7, "version": "0.1.0"}
    write_state(str(tmp_path / "a"), {**header, "targets": targets})
    write_state_targets(
        str(tmp_path / "b"),
        header,
        {path: json.dumps(target) for path, target in targets.items()},
    )
    first = StateReader(str(tmp_path / "a")).read().document
    second = StateReader(str(tmp_path / "b")).read().document
    assert first == second
    assert list(second) == ["schema", "generated_at", "host", "pid", "version", "targets"]
    assert second["targets"]['/we"ird\\ü'] == {"status": "degraded"}
