"""The Containerfile (no container engine here to build it): what it copies exists, it installs
what pyproject needs, and it runs the daemon as the Kubernetes examples expect."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from fsprobe.daemon import config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
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
    needed = {"pyproject.toml", pyproject["project"]["readme"], "fsprobe"}
    needed |= set(pyproject["project"]["license-files"])  # setuptools refuses to build without
    assert needed <= copied


def test_the_base_is_pinned_by_digest_and_the_image_is_labelled() -> None:
    """Issue 11.8: a tag alone is moved by every upstream rebuild; OCI labels say what it is."""
    instructions = _instructions()
    arguments = dict(
        argument.split("=", 1)
        for keyword, argument in instructions
        if keyword == "ARG" and "=" in argument
    )
    bases = [argument.split()[0] for keyword, argument in instructions if keyword == "FROM"]
    assert bases == ["${BASE}", "${BASE}"]
    assert re.fullmatch(
        r"docker\.io/library/python:3\.\d+\.\d+-slim-\w+@sha256:[0-9a-f]{64}", arguments["BASE"]
    )
    labels = " ".join(argument for keyword, argument in _final_stage() if keyword == "LABEL")
    for key in ("title", "description", "version", "licenses", "source", "documentation"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert f'org.opencontainers.image.licenses="{pyproject["project"]["license"]}"' in labels
    assert arguments["VERSION"] == pyproject["project"]["version"]


def test_the_image_runs_the_daemon_unprivileged_on_the_exposed_port() -> None:
    stage = dict(_final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["fsprobe"]
    command = json.loads(stage["CMD"])
    assert command[0] == "run"
    host, port = config.parse_listen(command[command.index("--listen") + 1])
    assert host == "0.0.0.0"
    assert stage["EXPOSE"] == str(port)
    assert stage["USER"].split(":")[0] not in ("0", "root")
