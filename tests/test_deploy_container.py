"""The Containerfile (no container engine here to build it): what it copies exists, it installs
what pyproject needs, and it runs the daemon as the Kubernetes examples expect."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fsprobe.daemon import config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
CONTAINERFILE = REPO / "deploy" / "container" / "Containerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    joined = CONTAINERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def test_every_copied_source_exists_in_the_repository() -> None:
    for keyword, arguments in _instructions():
        if keyword == "COPY" and not arguments.startswith("--from"):
            *sources, _destination = arguments.split()
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"


def test_the_build_copies_what_pyproject_needs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    copied = {
        source
        for keyword, arguments in _instructions()
        if keyword == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    }
    assert {"pyproject.toml", pyproject["project"]["readme"], "fsprobe"} <= copied


def test_the_image_runs_the_daemon_unprivileged_on_the_exposed_port() -> None:
    stage = dict(_final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["fsprobe"]
    command = json.loads(stage["CMD"])
    assert command[0] == "run"
    host, port = config.parse_listen(command[command.index("--listen") + 1])
    assert host == "0.0.0.0"
    assert stage["EXPOSE"] == str(port)
    assert stage["USER"].split(":")[0] not in ("0", "root")
