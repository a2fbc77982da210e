"""Dataclasses to and from JSON values, by their type hints: one codec for every JSON document.

A `Form` lists a dataclass's keys in document order; each value is written and read by its
field's type hint. Reading checks every value and raises only `FormatError`, naming the field
(``reasons[0].severity: 'bad' is not one of notice, degraded, unhealthy``).
"""

from __future__ import annotations

import ast
import builtins
import collections.abc
import dataclasses
import enum
import functools
import sys
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, Union

T = TypeVar("T")


class FormatError(ValueError):
    """A document that does not read: the message names the field and says why."""


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {**_KINDS, list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _at(where: str, key: object) -> str:
    if key is None:
        return where
    return f"{where}.{key}" if where else str(key)


@dataclasses.dataclass(frozen=True)
class _Codec:
    """How the values of one type hint are written, recognised and read. A value at `key` of
    the object at `where` names its place only in an error, so a path is made only there or
    where a reader descends."""

    noun: str  # what a reader of the error is told was expected: "an integer"
    accepts: Callable[[Any], bool]
    write: Callable[[Any], Any] | None = None  # None: written as it is
    convert: Callable[[Any, str, object], Any] | None = None  # None: read as it is

    def read(self, value: Any, where: str, key: object = None) -> Any:
        if not self.accepts(value):
            raise FormatError(f"{_at(where, key)}: expected {self.noun}, not {_kind(value)}")
        return value if self.convert is None else self.convert(value, where, key)

    def put(self, value: Any) -> Any:
        return value if self.write is None else self.write(value)


@functools.cache  # four kinds, one codec each
def _scalar(kind: type) -> _Codec:
    # bool is an int to Python, never to a reader of JSON.
    if kind is float:
        accepts = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        return _Codec("a number", accepts, convert=lambda value, where, key: float(value))
    noun = "true or false" if kind is bool else _KINDS[kind]
    return _Codec(noun, lambda v: isinstance(v, kind) and (kind is bool or type(v) is not bool))


def _enum(kind: type[enum.Enum]) -> _Codec:
    """A member by its ``label`` (fsprobe's levels) or its value."""
    labelled = hasattr(kind, "label")
    write = (lambda m: m.label) if labelled else (lambda m: m.value)
    members = {write(member): member for member in kind}

    def convert(value: str, where: str, key: object) -> enum.Enum:
        member = members.get(value)
        if member is None:
            names = ", ".join(map(str, members))
            raise FormatError(f"{_at(where, key)}: {value!r} is not one of {names}")
        return member

    return _Codec("a string", lambda v: isinstance(v, str), write, convert)


def _codec(hint: Any, names: tuple[str, ...] = ()) -> _Codec:
    """The codec of `hint`; `names` are the keys of a fixed tuple written as an object."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        (inner,) = (arg for arg in args if arg is not type(None))
        codec = _codec(inner, names)
        return _Codec(
            "true, false or null" if inner is bool else f"{codec.noun} or null",
            lambda v: v is None or codec.accepts(v),
            codec.write and (lambda v: None if v is None else codec.put(v)),
            codec.convert and (lambda v, w, k: None if v is None else codec.read(v, w, k)),
        )
    if origin is tuple and args[-1] is Ellipsis:
        item = _codec(args[0], names)

        def items(value: list[Any], where: str, key: object) -> tuple[Any, ...]:
            at = _at(where, key)
            return tuple(item.read(x, f"{at}[{i}]") for i, x in enumerate(value))

        return _Codec(
            "a list", lambda v: isinstance(v, list), lambda v: list(map(item.put, v)), items
        )
    if origin is tuple:  # (errno, step): an object with a key per place
        assert len(names) == len(args), f"name the places of {hint}"
        parts = [(name, _codec(arg)) for name, arg in zip(names, args)]
        return _Codec(
            "an object",
            lambda v: isinstance(v, dict),
            lambda v: {name: codec.put(x) for (name, codec), x in zip(parts, v)},
            lambda v, w, k: tuple(_field(v, _at(w, k), name, codec) for name, codec in parts),
        )
    if origin in (dict, collections.abc.Mapping):
        form, value = _FORMS.get(typing.get_origin(args[1]) or args[1]), _codec(args[1])

        def convert(v: dict[str, Any], where: str, key: object) -> dict[str, Any]:
            at = _at(where, key)
            if form is None or form.keyed is None:
                return {name: value.read(x, at, name) for name, x in v.items()}
            return {name: form.decode(x, _at(at, name), key=name) for name, x in v.items()}

        return _Codec(
            "an object",
            lambda v: isinstance(v, dict),
            lambda v: {name: value.put(x) for name, x in v.items()},
            convert,
        )
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    if (origin or hint) in _FORMS:
        form = _FORMS[origin or hint]
        return _Codec(
            "an object",
            lambda v: isinstance(v, dict),
            form.encode,
            lambda v, where, key: form.decode(v, _at(where, key)),
        )
    return _scalar(hint)


def _constant(value: object) -> Callable[[], object]:
    return lambda: value


def _field(document: dict[str, Any], where: str, key: str, codec: _Codec) -> Any:
    if key not in document:
        raise FormatError(f"{_at(where, key)}: missing")
    return codec.read(document[key], where, key)


def _evaluate(node: ast.expr, namespace: Mapping[str, Any]) -> Any:
    """A type hint from its text, also ``int | None`` before Python 3.10 can evaluate it."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return Union[_evaluate(node.left, namespace), _evaluate(node.right, namespace)]
    if isinstance(node, ast.Subscript):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _evaluate(node.value, namespace)[tuple(_evaluate(i, namespace) for i in items)]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        found = namespace.get(node.id, getattr(builtins, node.id, None))
        if found is None:
            raise TypeError(f"cannot resolve the type hint {node.id}")
        return found
    raise TypeError(f"unsupported type hint {ast.dump(node)}")


@functools.cache  # the same hints recur: ``str``, ``float | None``
def _hint(text: str, module: str) -> Any:
    """The type hint `text` in `module`."""
    return _evaluate(ast.parse(text, mode="eval").body, vars(sys.modules[module]))


@dataclasses.dataclass(frozen=True)
class _Key:
    name: str  # in the document
    attr: str  # of the value
    optional: bool  # may be absent from a document
    absent: Callable[[], object]  # the value then: the field's default, or None
    derived: bool  # written, never read (a property, or an old name written beside the new)
    old: str | None  # the key's name in documents written before it was renamed
    choices: tuple[str, ...] | None
    codec: _Codec  # for a derived value that is not a field: written as it is


#: The form of each class that has one: a field of that class is read and written by it.
_FORMS: dict[Any, Form[Any]] = {}


class Form(Generic[T]):
    """The JSON object of dataclass `cls`: its keys in document order, each ``name``, or
    ``name=attr`` for an attribute of another name, suffixed ``?`` (may be absent: the field's
    default, or None) or ``!`` (derived: written, never read).

    `renamed` maps a key to its name in older documents (read there when it is absent);
    `named` the keys of a field of fixed tuples, written as objects; `choices` the strings a
    field may hold. `keyed`: the attribute that holds the object's key where a mapping holds
    it, and the keys allowed (``probes.statvfs`` is the probe ``statvfs``). `name`: the
    document's, in an error about a document that is no object. Creating a form registers it
    for the fields of other forms that hold its class.
    """

    def __init__(
        self,
        cls: type[T],
        keys: str,
        *,
        renamed: Mapping[str, str] | None = None,
        named: Mapping[str, tuple[str, ...]] | None = None,
        choices: Mapping[str, tuple[str, ...]] | None = None,
        keyed: tuple[str, tuple[str, ...]] | None = None,
        name: str = "",
    ) -> None:
        self.cls = cls
        self.keyed = keyed
        self.name = name or cls.__name__.lower()
        self._spec = keys.split()
        self._renamed = dict(renamed or {})
        self._named = dict(named or {})
        self._choices = dict(choices or {})
        _FORMS[cls] = self

    @functools.cached_property
    def _keys(self) -> tuple[_Key, ...]:
        """Compiled on first use, when every form a field refers to exists."""
        fields = {field.name: field for field in dataclasses.fields(self.cls)}  # type: ignore[arg-type]
        keys = []
        for token in self._spec:
            name, _, attr = token.rstrip("?!").partition("=")
            field = fields.get(attr or name)
            codec = _Codec("anything", lambda value: True)
            absent: Callable[[], object] = _constant(None)
            if field is not None:
                hint = field.type
                if isinstance(hint, str):
                    hint = _hint(hint, self.cls.__module__)
                codec = _codec(hint, self._named.get(name, ()))
                if field.default is not dataclasses.MISSING:
                    absent = _constant(field.default)
                elif field.default_factory is not dataclasses.MISSING:
                    absent = field.default_factory
            derived, old = token.endswith("!"), self._renamed.get(name)
            choices = self._choices.get(name)
            keys.append(
                _Key(name, attr or name, token.endswith("?"), absent, derived, old, choices, codec)
            )
        return tuple(keys)

    def encode(self, value: T) -> dict[str, Any]:
        """The document of `value`."""
        document = {}
        for key in self._keys:  # a plain loop: at 100 targets the daemon encodes often
            field = getattr(value, key.attr)
            write = key.codec.write
            document[key.name] = field if write is None else write(field)
        return document

    def decode(self, document: Any, where: str = "", *, key: str = "", **given: Any) -> T:
        """The value `document` holds (`FormatError` if none); `given`: attributes that the
        document does not hold. `key`: the document's key in the mapping that holds it."""
        if self.keyed is not None:
            attr, allowed = self.keyed
            if key not in allowed:
                raise FormatError(f"{where}: not one of {', '.join(allowed)}")
            given[attr] = key
        if not isinstance(document, dict):
            raise FormatError(f"{where or self.name}: expected an object, not {_kind(document)}")
        for spec in self._keys:
            if spec.derived:
                continue
            name = spec.name
            if name not in document:
                if spec.old is not None and spec.old in document:
                    name = spec.old
                elif spec.optional:
                    given[spec.attr] = spec.absent()
                    continue
                else:
                    raise FormatError(f"{_at(where, name)}: missing")
            value, codec = document[name], spec.codec
            if not codec.accepts(value):
                raise FormatError(f"{_at(where, name)}: expected {codec.noun}, not {_kind(value)}")
            if codec.convert is not None:
                value = codec.convert(value, where, name)
            given[spec.attr] = value
            if spec.choices is not None and value not in spec.choices:
                raise FormatError(
                    f"{_at(where, name)}: {value!r} is not one of {', '.join(spec.choices)}"
                )
        return self.cls(**given)
