"""The state file's reader: trust checks, corrupt files, and the parse cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fsprobe.model import Status
from fsprobe.report import TargetState
from fsprobe.state import (
    ANSWER_KEY,
    STATE_FILE,
    CorruptStateFile,
    StateReader,
    UntrustedStateFile,
    Writer,
    write_state,
)
from tests.support.capability import need_root
from tests.support.state import daemon_view
from tests.support.users import share

NOBODY = 65534


@pytest.fixture(scope="module")
def view_text(tmp_path_factory) -> str:
    """A real target's state, as the daemon encodes it."""
    return json.dumps(daemon_view(str(tmp_path_factory.mktemp("ckpt"))).to_dict())


def write(directory: Path, targets: dict[str, str], generated_at: float = 1_700_000_000.0) -> None:
    write_state(str(directory), generated_at, Writer("h", 1, "0.1.0"), targets)


@pytest.fixture
def state_dir(tmp_path: Path, view_text: str) -> Path:
    directory = tmp_path / "state"
    write(directory, {"/ckpt": view_text})
    return directory


def test_a_file_written_by_write_state_is_trusted_and_parsed(state_dir, view_text):
    state = StateReader(str(state_dir)).read()
    assert json.loads((state_dir / STATE_FILE).read_bytes())["schema"] == 1
    assert state.names == ["/ckpt"]
    assert TargetState.read(state, "/ckpt").to_dict() == json.loads(view_text)
    assert state.answer("/ckpt").status is Status.OK
    assert state.generated_at == 1_700_000_000.0
    assert state.writer == Writer("h", 1, "0.1.0")
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
    need_root("giving the state file to another user")
    os.chown(state_dir / STATE_FILE, NOBODY, 0)  # the owner counts, not a trusted group
    with pytest.raises(UntrustedStateFile, match=f"belongs to uid {NOBODY}, not to you"):
        StateReader(str(state_dir)).read()


def test_a_directory_owned_by_another_user_is_refused(state_dir):
    need_root("giving the state directory to another user")
    os.chown(state_dir, NOBODY, 0)
    with pytest.raises(UntrustedStateFile, match="state directory"):
        StateReader(str(state_dir)).read()


def test_writing_into_a_directory_of_another_user_is_refused(tmp_path):
    need_root("giving a directory to another user")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UntrustedStateFile, match=f"belongs to uid {NOBODY}"):
        write(planted, {})
    assert not (planted / STATE_FILE).exists()


def _read(state_dir: str) -> str:
    """What an (unprivileged) reader makes of a state dir: "trusted" or why not."""
    try:
        StateReader(state_dir).read()
    except UntrustedStateFile as error:
        return str(error)
    return "trusted"


def _write(state_dir: str) -> str:
    try:
        write(Path(state_dir), {})
    except UntrustedStateFile as error:
        return str(error)
    return "written"


def test_a_reader_trusts_its_own_state_and_roots_and_nobody_elses(local_users, tmp_path):
    """Run as real unprivileged users, where the kernel's permission checks apply."""
    share(tmp_path)
    alice, bob = local_users.user(), local_users.user()
    shared = tmp_path / "tmp"  # like /tmp: everyone makes their own state dir there
    shared.mkdir()
    shared.chmod(0o1777)
    roots, alices, bobs = shared / "root", shared / "alice", shared / "bob"
    write(roots, {})
    assert alice.run(_write, str(alices)) == "written"
    assert bob.run(_write, str(bobs)) == "written"

    assert alice.run(_read, str(alices)) == "trusted"
    assert alice.run(_read, str(roots)) == "trusted"
    assert f"belongs to uid {bob.uid}, not to you ({alice.uid}) or root" in alice.run(
        _read, str(bobs)
    )
    os.chown(bobs / STATE_FILE, alice.uid, alice.gid)  # her file, in Bob's directory
    assert "state directory" in alice.run(_read, str(bobs))
    assert f"belongs to uid {bob.uid}" in alice.run(_write, str(bobs))
    assert (bobs / STATE_FILE).stat().st_uid == alice.uid  # not replaced


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
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),  # nested too deep: no RecursionError
        (b'{"schema": 2, "targets": {}}', "has schema 2"),
        (b'["schema", 1]', "has schema None"),
        (b'{"schema": 1, "generated_at": 1, "targets": []}', "'targets' is not an object"),
    ],
)
def test_a_corrupt_file_is_reported_with_the_reason(state_dir, content, message):
    path = state_dir / STATE_FILE
    path.write_bytes(content)
    with pytest.raises(CorruptStateFile, match=message):
        StateReader(str(state_dir)).read()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"schema": 1, "targets": {}}', "does not read: generated_at: missing"),
        (
            b'{"schema": 1, "generated_at": 1, "pid": "me", "targets": {}}',
            "pid: expected an integer or null, not a string",
        ),
    ],
)
def test_a_corrupt_top_level_is_reported_when_it_is_read(state_dir, content, message):
    """A save reads one target's answer, never the top level: `fsprobe status` does."""
    (state_dir / STATE_FILE).write_bytes(content)
    state = StateReader(str(state_dir)).read()
    for read in (lambda: state.writer, lambda: state.generated_at):
        with pytest.raises(CorruptStateFile, match=message):
            read()


def test_a_target_without_an_answer_has_none_and_one_that_does_not_read_is_corrupt(
    state_dir, view_text
):
    """A state file of the version before the answer: the target reads, its answer is None
    (a save then probes inline); an answer that does not read names its field."""
    document = json.loads(view_text)
    answer = document.pop(ANSWER_KEY)
    write(state_dir, {"/ckpt": json.dumps(document)})
    state = StateReader(str(state_dir)).read()
    assert state.answer("/ckpt") is None and state.watching("/ckpt/m.pt") == ("/ckpt", None)
    assert TargetState.read(state, "/ckpt").report.status is Status.OK
    for key, value, message in [
        ("can_take_save", "yes", "can_take_save: expected true or false, not a string"),
        ("status", "fine", "status: 'fine' is not one of ok, degraded, unhealthy, unknown"),
        ("reasons", [{"code": "x"}], r"reasons\[0\]\.severity: missing"),
    ]:
        write(state_dir, {"/ckpt": json.dumps({**document, ANSWER_KEY: {**answer, key: value}})})
        state = StateReader(str(state_dir)).read()
        with pytest.raises(CorruptStateFile, match=rf"targets\['/ckpt'\]\.answer\.{message}"):
            state.answer("/ckpt")


def test_the_parse_is_cached_until_the_file_changes(state_dir, view_text):
    reader = StateReader(str(state_dir))
    first = reader.read()
    assert reader.read() is first
    write(state_dir, {"/other": view_text})
    second = reader.read()
    assert second is not first and second.names == ["/other"]
    assert reader.read() is second


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"status": "ok"}, "targets['/ckpt'].path: missing"),  # an old or foreign writer
        (5, "targets['/ckpt']: expected an object, not an integer"),
    ],
)
def test_a_target_that_does_not_read_is_corrupt_and_says_which_field(state_dir, target, message):
    write(state_dir, {"/ckpt": json.dumps(target)})
    state = StateReader(str(state_dir)).read()  # the top level reads; the target does not
    with pytest.raises(CorruptStateFile) as raised:
        TargetState.read(state, "/ckpt")
    assert message in str(raised.value) and "written by fsprobe 0.1.0" in str(raised.value)


def test_a_target_without_its_intervals_is_corrupt(state_dir, view_text):
    document = json.loads(view_text)
    del document["intervals"]
    write(state_dir, {"/ckpt": json.dumps(document)})
    with pytest.raises(CorruptStateFile, match=r"targets\['/ckpt'\]\.intervals"):
        TargetState.read(StateReader(str(state_dir)).read(), "/ckpt")


def test_a_trust_change_is_noticed_even_with_a_cached_parse(state_dir):
    reader = StateReader(str(state_dir))
    reader.read()
    os.chmod(state_dir / STATE_FILE, 0o666)
    with pytest.raises(UntrustedStateFile):
        reader.read()


def test_an_owner_change_is_noticed_even_with_a_cached_parse(state_dir):
    need_root("giving the state file to another user")
    reader = StateReader(str(state_dir))
    reader.read()
    os.chown(state_dir / STATE_FILE, NOBODY, -1)  # only the owner changes: no mtime, no mode
    with pytest.raises(UntrustedStateFile, match=f"belongs to uid {NOBODY}"):
        reader.read()


def read_as(uid: int, state_dir: Path) -> str:
    """What an ordinary user's reader makes of `state_dir`: read in a forked child that entered
    the directory and then dropped root (the path above it need not be open to that user)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.chdir(state_dir)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            outcome = "trusted " + ",".join(StateReader(".").read().names)
        except BaseException as error:
            outcome = f"{type(error).__name__}: {error}"
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as pipe:
        return pipe.read().decode()


def test_an_ordinary_user_trusts_roots_state_and_their_own_but_no_one_elses(state_dir):
    """The node daemon runs as root, a trainer as itself: root's state file is trusted, so is
    the user's own, another user's is not (seen from the user's side, where root's bypasses
    of permission checks cannot hide a mistake)."""
    need_root("a state file of root and one of another user")
    assert read_as(NOBODY, state_dir) == "trusted /ckpt"
    for path in (state_dir, state_dir / STATE_FILE):
        os.chown(path, NOBODY, NOBODY)
    assert read_as(NOBODY, state_dir) == "trusted /ckpt"
    stranger = NOBODY - 1
    os.chown(state_dir / STATE_FILE, stranger, NOBODY)
    assert read_as(NOBODY, state_dir).startswith("UntrustedStateFile: ")
    assert f"belongs to uid {stranger}, not to you ({NOBODY}) or root" in read_as(NOBODY, state_dir)


def test_target_for_picks_the_closest_watched_ancestor(state_dir, view_text):
    write(state_dir, {"/ckpt": view_text, "/ckpt/run1": view_text})
    state = StateReader(str(state_dir)).read()
    assert state.target_for("/ckpt/run1/epoch-3") == "/ckpt/run1"
    assert state.target_for("/ckpt/run10") == "/ckpt"
    assert state.target_for("/ckpt") == "/ckpt"
    assert state.target_for("/elsewhere") is None


def test_a_relative_path_is_judged_where_the_working_directory_is_now(
    state_dir, view_text, tmp_path, monkeypatch
):
    """What watches a path is found once per absolute path and parsed file; a relative path
    means another directory once the working directory changes, and is looked up again."""
    ckpt, run = tmp_path / "ckpt", tmp_path / "ckpt" / "run1"
    run.mkdir(parents=True)
    write(state_dir, {str(ckpt): view_text, str(run): view_text})
    state = StateReader(str(state_dir)).read()
    for where, target in ((tmp_path, None), (ckpt, ckpt), (run, run), (ckpt, ckpt)):
        monkeypatch.chdir(where)
        watched = state.watching("epoch-3")
        assert (watched[0] if watched else None) == (str(target) if target else None)
        assert state.watching(str(run / "epoch-3")) == (str(run), state.answer(str(run)))


def test_targets_are_joined_as_json_text_whatever_their_names(tmp_path, view_text):
    names = ["/ckpt", '/we"ird\\ü']
    write(tmp_path, dict.fromkeys(names, view_text), generated_at=1.5)
    document = json.loads((tmp_path / STATE_FILE).read_bytes())
    assert list(document) == [
        "schema",
        "generated_at",
        "host",
        "pid",
        "version",
        "once",
        "stopped_at",
        "failure",
        "targets",
    ]
    assert document["targets"] == dict.fromkeys(names, json.loads(view_text))
    assert StateReader(str(tmp_path)).read().names == sorted(names)
