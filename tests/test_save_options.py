"""`fsprobe.SaveOptions`: one value for every save's options, resolved once, the same on every
kind of save (docs/design.md §7); the process's state owned by a `SaveContext`, not by globals."""

from __future__ import annotations

import dataclasses
import inspect
import os

import pytest

import fsprobe
import fsprobe.distributed
from fsprobe.saving.options import SaveOptions
from fsprobe.saving.preflight import SaveContext

SAVES = {
    "save": fsprobe.save,
    "atomic_write": fsprobe.atomic_write,
    "save_dir": fsprobe.save_dir,
    "distributed.save_dir": fsprobe.distributed.save_dir,
}
#: Options a save cannot take, and why (none now: the collective save bounds each attempt too).
NOT_TAKEN: set[tuple[str, str]] = set()


def test_save_options_is_public_and_frozen():
    assert fsprobe.SaveOptions is SaveOptions and "SaveOptions" in fsprobe.__all__
    with pytest.raises(dataclasses.FrozenInstanceError):
        SaveOptions().attempts = 2  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(SAVES))
def test_every_save_takes_every_option_with_the_same_default(name):
    parameters = inspect.signature(SAVES[name]).parameters
    assert parameters["options"].default is None
    for field in dataclasses.fields(SaveOptions):
        if (name, field.name) in NOT_TAKEN:
            assert field.name not in parameters
            continue
        assert field.name in parameters, f"{name} does not take {field.name}"
        default = parameters[field.name].default
        expected = None if field.name == "backoff" else field.default
        assert default == expected, f"{name}({field.name}={default!r}), SaveOptions: {expected!r}"


def test_preflight_and_check_count_one_inode_by_default():
    assert inspect.signature(fsprobe.preflight).parameters["need_inodes"].default == 1
    assert SaveOptions().need_inodes == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"attempts": 0}, "attempts"),
        ({"save_timeout": 0}, "save_timeout"),
        ({"on_unhealthy": "maybe"}, "on_unhealthy"),
    ],
)
def test_a_bad_option_is_refused_when_the_options_are_made(arguments, message):
    with pytest.raises(ValueError, match=message):
        SaveOptions(**arguments)


def test_the_environment_s_fallbacks_are_added_once_after_the_caller_s(tmp_path):
    given, from_env = tmp_path / "given", tmp_path / "env"
    options = SaveOptions(fallback_dirs=(str(given),))
    resolved = options.resolved({"FSPROBE_FALLBACK_DIRS": f"{from_env}:{given}"})
    assert resolved.fallback_dirs == (str(given), str(from_env))
    assert options.resolved({}).resolved({}) == options.resolved({})
    no_redirect = dataclasses.replace(options, redirect=False)
    assert no_redirect.resolved({"FSPROBE_FALLBACK_DIRS": str(from_env)}).fallback_dirs == ()


def test_a_save_takes_its_options_as_one_value(tmp_path):
    options = SaveOptions(attempts=1, preflight=False, state_dir=str(tmp_path / "state"))
    result = fsprobe.atomic_write(tmp_path / "a.bin", lambda f: f.write(b"x" * 10), options=options)
    assert (result.bytes, result.attempts) == (10, 1)
    assert (tmp_path / "a.bin").read_bytes() == b"x" * 10


def test_options_and_keyword_options_together_are_refused(tmp_path):
    with pytest.raises(TypeError, match="either"):
        fsprobe.atomic_write(
            tmp_path / "a.bin", lambda f: f.write(b"x"), options=SaveOptions(), attempts=2
        )
    assert not os.path.exists(tmp_path / "a.bin")


def test_a_save_context_of_its_own_starts_empty_and_keeps_its_sizes_to_itself(tmp_path):
    mine, other = SaveContext(), SaveContext()
    mine.remember_save(str(tmp_path / "a.pt"), 1000)
    assert mine.expected_need(str(tmp_path / "a.pt")) == 1100
    assert other.expected_need(str(tmp_path / "a.pt")) is None
