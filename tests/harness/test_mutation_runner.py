"""The mutation runner (tests/support/mutation) makes exactly the mistakes it says, and its list of
accepted survivors names mutants that exist."""

from __future__ import annotations

from pathlib import Path

from tests.support.mutation.mutants import apply, find
from tests.support.mutation.survivors import EXPLAINED
from tests.support.mutation.targets import TARGETS

REPO = Path(__file__).resolve().parents[2]

SOURCE = '''
import dataclasses, logging, os
log = logging.getLogger("x")

@dataclasses.dataclass(frozen=True)
class Limits:
    ratio: float = 0.03

def judge(fd: int, ratio: float) -> bool:
    """Docstrings are left alone: 1 < 2."""
    log.warning("never deleted: %d", 1)
    os.fsync(fd)
    return ratio < Limits().ratio and not fd
'''


def descriptions(wanted: str) -> list[str]:
    return sorted(m.description for m in find(SOURCE, frozenset({wanted})))


def test_only_the_wanted_scope_is_mutated_and_never_logs_docstrings_or_decorators():
    assert descriptions("judge") == sorted(["< -> <=", "and -> or", "not x -> x", "call deleted"])
    assert descriptions("Limits") == ["0.03 -> 0.04"]
    assert descriptions("nothing") == []


def test_each_mutant_changes_exactly_its_node():
    mutants = {m.description: m for m in find(SOURCE, frozenset({"judge"}))}
    assert "ratio <= Limits().ratio" in apply(SOURCE, mutants["< -> <="])
    assert "os.fsync(fd)" not in apply(SOURCE, mutants["call deleted"])
    assert "log.warning" in apply(SOURCE, mutants["call deleted"])
    assert "or not fd" in apply(SOURCE, mutants["and -> or"])
    assert "Limits().ratio and fd" in apply(SOURCE, mutants["not x -> x"])


def test_every_accepted_survivor_is_a_mutant_of_the_tree_as_it_is():
    keys = {
        f"{target.module} {mutant.key()}"
        for target in TARGETS
        for mutant in find((REPO / target.module).read_text(), target.scopes)
    }
    assert set(EXPLAINED) <= keys, "survivors.py names mutants that no longer exist"


def test_every_target_names_existing_code_and_tests():
    for target in TARGETS:
        assert (REPO / target.module).is_file(), target.module
        assert find((REPO / target.module).read_text(), target.scopes), target.name
        assert all((REPO / test).is_file() for test in target.tests), target.name
