"""`fsprobe.SaveOptions`: one value for every save's options, resolved once, the same on every
kind of save (docs/design.md §7); the process's state owned by a `SaveContext`, not by globals."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable

import pytest

import fsprobe
import fsprobe.distributed
from fsprobe.integrations import dcp
from fsprobe.saving import options as options_module
from fsprobe.saving.context import SaveContext
from fsprobe.saving.options import Backoff, SaveOptions
from fsprobe.saving.preflight import expected_need

#: Every public entry that takes save options: (name, call(path, **options)).
ENTRIES: dict[str, Callable[..., object]] = {
    "SaveOptions": lambda path, **options: SaveOptions(**options),
    "save": lambda path, **options: fsprobe.save({}, path / "a.pt", **options),
    "atomic_write": lambda path, **options: fsprobe.atomic_write(
        path / "a.bin", lambda f: f.write(b"x"), **options
    ),
    "save_dir": lambda path, **options: fsprobe.save_dir(path / "d", lambda d: None, **options),
    "distributed.save_dir": lambda path, **options: fsprobe.distributed.save_dir(
        path / "d", lambda d: None, **options
    ),
    "save_async": lambda path, **options: fsprobe.save_async({}, path / "a.pt", **options),
    "preflight": lambda path, **options: fsprobe.preflight(path / "a.pt", **options),
    "dcp.FsprobeWriter": lambda path, **options: dcp.FsprobeWriter(path / "d", **options),
    "dcp.save": lambda path, **options: dcp.save({}, path / "d", **options),
    "dcp.async_save": lambda path, **options: dcp.async_save({}, path / "d", **options),
}
#: Per option: a value of a wrong type, and a wrong value (None: every value of the type is
#: right, as for a flag).
WRONG: dict[str, tuple[object, object]] = {
    "attempts": ("3", 0),
    "backoff": (0.2, None),
    "fallback_dirs": (5, [""]),
    "max_wait": ("1", -1.0),
    "need_bytes": (1.5, -1),
    "need_inodes": ("1", -1),
    "preflight": ("yes", None),
    "fsync": (1, None),
    "redirect": (None, None),
    "on_unhealthy": (1, "maybe"),
    "state_dir": (5, ""),
    "timeout": ("10", 0),
    "save_timeout": ("1", float("inf")),
}


#: The overrides that accept more than the field holds: what `SaveOptions` converts when made.
WIDENED = {
    "backoff": "Backoff | None",  # None: the default
    "fallback_dirs": "Iterable[str | os.PathLike[str]]",  # made a tuple of str
    "state_dir": "str | os.PathLike[str] | None",  # made a str
}


def test_save_overrides_mirror_every_option_with_its_type():
    """`SaveOverrides` (for type checkers only, so read from the source) names every field of
    `SaveOptions`, in order, with the field's own type or, for the fields it converts, the
    wider type it accepts: a new option cannot be forgotten in the keywords of the saves."""
    source = ast.parse(inspect.getsource(options_module))
    (overrides,) = [
        node
        for node in ast.walk(source)
        if isinstance(node, ast.ClassDef) and node.name == "SaveOverrides"
    ]
    mirrored = {
        statement.target.id: ast.unparse(statement.annotation)
        for statement in overrides.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    }
    fields = {field.name: field.type for field in dataclasses.fields(SaveOptions)}
    assert list(mirrored) == list(fields)
    assert {name: mirrored[name] for name in fields} == {**fields, **WIDENED}


def test_every_option_has_a_wrong_type_and_a_wrong_value_to_try():
    assert set(WRONG) == {field.name for field in dataclasses.fields(SaveOptions)}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize(
    ("option", "kind"),
    [
        (option, kind)
        for option in sorted(WRONG)
        for kind, wrong in zip(("type", "value"), WRONG[option])
        if wrong is not None or kind == "type"
    ],
)
def test_a_wrong_option_fails_when_made_naming_the_option_and_writing_nothing(
    tmp_path, entry, option, kind
):
    """Issue 28.3: `backoff=0.2` is a TypeError at the call, not an AttributeError at the
    first failed attempt, on every entry point; a wrong value is a ValueError."""
    wrong = WRONG[option][0 if kind == "type" else 1]
    target = tmp_path / "target"
    target.mkdir()
    expected = TypeError if kind == "type" else ValueError
    with pytest.raises(expected, match=option):
        ENTRIES[entry](target, **{option: wrong})
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("entry", sorted(e for e in ENTRIES if e.startswith("dcp.")))
def test_dcp_refuses_a_deadline_it_cannot_keep_however_given(tmp_path, entry):
    """An attempt of a DCP save is DCP's collectives, never abandoned: `save_timeout` is
    refused by name, as a keyword or in `options`; its default is not, nor the other options."""
    with pytest.raises(TypeError, match="FsprobeWriter does not take save_timeout"):
        ENTRIES[entry](tmp_path, save_timeout=60.0)
    with pytest.raises(TypeError, match="FsprobeWriter does not take save_timeout"):
        ENTRIES[entry](tmp_path, options=SaveOptions(save_timeout=60.0))
    writer = dcp.FsprobeWriter(tmp_path / "d", options=SaveOptions(need_bytes=1, fsync=False))
    assert writer.sync_files is False  # `fsync` is DCP's `sync_files`
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_backoff_is_refused_when_made():
    with pytest.raises(ValueError, match="base"):
        Backoff(base=-1.0)
    with pytest.raises(TypeError, match="cap"):
        Backoff(cap="15")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sleep"):
        Backoff(sleep=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("entry", sorted(set(ENTRIES) - {"SaveOptions"}))
def test_a_keyword_that_is_no_option_is_refused_naming_it(tmp_path, entry):
    with pytest.raises(TypeError, match="atempts"):
        ENTRIES[entry](tmp_path, atempts=3)
    assert list(tmp_path.iterdir()) == []


def test_save_options_is_public_and_frozen():
    assert fsprobe.SaveOptions is SaveOptions and "SaveOptions" in fsprobe.__all__
    with pytest.raises(dataclasses.FrozenInstanceError):
        SaveOptions().attempts = 2  # type: ignore[misc]


def test_saves_count_one_inode_by_default():
    assert SaveOptions().need_inodes == 1


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


def test_keywords_override_the_options_they_are_given_with(tmp_path):
    options = SaveOptions(attempts=1, preflight=False)
    result = fsprobe.atomic_write(
        tmp_path / "a.bin", lambda f: f.write(b"x"), options=options, need_bytes=1 << 60
    )
    assert (result.attempts, (tmp_path / "a.bin").read_bytes()) == (1, b"x")
    decision = fsprobe.preflight(
        tmp_path / "b.bin", options=options, need_bytes=1 << 60, state_dir=str(tmp_path / "s")
    )
    assert (decision.need_bytes, decision.fits) == (1 << 60, False)


def test_a_save_takes_a_context_of_its_own(tmp_path):
    mine = SaveContext()
    fsprobe.atomic_write(
        tmp_path / "a.bin", lambda f: f.write(b"x" * 1000), preflight=False, context=mine
    )
    assert expected_need(mine, str(tmp_path / "a.bin")) == 1100
    assert expected_need(fsprobe.default_context(), str(tmp_path / "a.bin")) is None
    future = fsprobe.save_async({"w": 1}, tmp_path / "b.pt", preflight=False, context=mine)
    fsprobe.wait_saves(timeout=60, context=mine)
    assert future.done() and expected_need(mine, str(tmp_path / "b.pt")) is not None
    assert fsprobe.default_context().background().pending() == []


def test_a_save_context_of_its_own_starts_empty_and_keeps_its_sizes_to_itself(tmp_path):
    mine, other = SaveContext(), SaveContext()
    mine.remember_save(str(tmp_path / "a.pt"), 1000)
    assert expected_need(mine, str(tmp_path / "a.pt")) == 1100
    assert expected_need(other, str(tmp_path / "a.pt")) is None


def test_the_same_plain_keywords_give_the_same_options_checked_once():
    """A trainer passes the same keywords to every save: made (and checked) once per process.
    Only plain values are kept; a value of another type is another option, and a wrong one
    is refused every time it is given."""
    first = options_module.save_options(None, {"max_wait": 120, "save_timeout": 600.0})
    again = options_module.save_options(None, {"save_timeout": 600.0, "max_wait": 120})
    assert first is again and (first.max_wait, first.save_timeout) == (120, 600.0)
    assert options_module.save_options(None, {"fsync": True}).fsync is True
    with pytest.raises(TypeError, match="fsync"):  # 1 == True, but it is no flag
        options_module.save_options(None, {"fsync": 1})
    for _ in range(2):
        with pytest.raises(ValueError, match="max_wait"):
            options_module.save_options(None, {"max_wait": -1})
    sleeps: list[float] = []
    backoff = Backoff(sleep=sleeps.append)
    chosen = options_module.save_options(None, {"backoff": backoff})
    assert chosen.backoff is backoff  # not one made for an equal backoff before


def test_fallback_lists_are_made_once_while_they_mean_the_same_directories(tmp_path, monkeypatch):
    """A list of absolute fallback directories is kept like a plain keyword, for each value of
    FSPROBE_FALLBACK_DIRS; a relative one means another directory once the working directory
    changes, and so does the environment once it changes."""
    first, second = tmp_path / "one", tmp_path / "two"
    monkeypatch.delenv("FSPROBE_FALLBACK_DIRS", raising=False)
    given = {"fallback_dirs": [str(first)], "max_wait": 1.0}
    made = options_module.save_options(None, given)
    assert made is options_module.save_options(None, {**given})
    assert made.fallback_dirs == (str(first),)
    monkeypatch.setenv("FSPROBE_FALLBACK_DIRS", str(second))
    assert options_module.save_options(None, given).fallback_dirs == (str(first), str(second))
    monkeypatch.setenv("FSPROBE_FALLBACK_DIRS", "relative")
    for directory in (tmp_path, tmp_path.parent):
        monkeypatch.chdir(directory)
        made = options_module.save_options(None, given)
        assert made.fallback_dirs[-1] == str(directory / "relative")
    monkeypatch.delenv("FSPROBE_FALLBACK_DIRS")
    for directory in (tmp_path, tmp_path.parent):
        monkeypatch.chdir(directory)
        made = options_module.save_options(None, {"fallback_dirs": ["fallback"]})
        assert made.fallback_dirs == (str(directory / "fallback"),)
