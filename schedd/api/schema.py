"""JSON Schema (2020-12, as OpenAPI 3.1 uses it) from Python types: the API's response bodies are
declared once, as the ``TypedDict`` s the views return (``schedd.api.views``), and their schemas
are derived from those declarations, so what mypy checks the views against is what the OpenAPI
document publishes.

What a type becomes:

* a ``TypedDict``: a closed object (``additionalProperties: false``), its ``NotRequired`` keys
  optional, its docstring the description; a ``$ref`` when it is one of the named components;
* ``Annotated[T, ...]``: ``T`` with each string as the description and each :func:`js` merged
  in (a format, a minimum);
* ``T | None``: ``null`` allowed; ``int | float``: a number; ``list[T]``: an array;
  ``Literal[...]``: the constants; an ``Enum``: its values (or ``Annotated[str, values(E)]``
  for a field holding ``E``'s plain values); ``Any``: any JSON value.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import (
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

Schema = dict[str, Any]


@dataclass(frozen=True, slots=True, eq=False)
class Keywords:
    """JSON Schema keywords to add to a type's schema, in ``Annotated`` (hashable, unlike a dict,
    so the annotated type can be part of a union): ``Annotated[int, js(minimum=1)]``."""

    items: tuple[tuple[str, Any], ...]


def js(**keywords: Any) -> Keywords:
    return Keywords(tuple(keywords.items()))


@dataclass(frozen=True, slots=True)
class Ref:
    """``Annotated[T, Ref(name)]``: the named component ``name`` (a schema given as it is,
    for the few that are not objects: a duration that is a number or a text)."""

    name: str


def values(members: type[enum.Enum]) -> Keywords:
    """The values of an enum, for a field the views fill with ``member.value`` (a plain ``str``,
    ``null`` too when the field is nullable)."""
    return js(enum=tuple(m.value for m in members))


_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and typing.is_typeddict(tp)


class Components:
    """Named schemas: each type given here is emitted once under its name and referred to by
    ``$ref`` wherever it appears."""

    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = dict(named)
        self._names = {self._key(tp): name for name, tp in named.items()}

    @staticmethod
    def _key(tp: Any) -> Any:
        return tp if _is_typeddict(tp) else repr(tp)

    def schemas(self) -> dict[str, Schema]:
        return {name: self.schema_of(tp, inline=True) for name, tp in self.named.items()}

    def schema_of(self, tp: Any, *, inline: bool = False) -> Schema:
        if not inline:
            name = self._names.get(self._key(tp))
            if name is not None:
                return {"$ref": f"#/components/schemas/{name}"}
        if get_origin(tp) is typing.Annotated:
            return self._annotated(tp, inline)
        if tp is None or tp is type(None):
            return {"type": "null"}
        if isinstance(tp, Mapping):  # a named component given as a schema
            return dict(tp)
        if _is_typeddict(tp):
            return self._object(tp)
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):
            return self._union(get_args(tp))
        if origin is list:
            (item,) = get_args(tp)
            return {"type": "array", "items": self.schema_of(item)}
        if origin is dict:
            _key, value = get_args(tp)
            return {"type": "object", "additionalProperties": self.schema_of(value)}
        if origin is Literal:
            consts = list(get_args(tp))
            if len(consts) == 1:
                return {"const": consts[0]}
            return {"type": "string", "enum": consts}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"type": "string", "enum": [member.value for member in tp]}
        if tp is Any:
            return {}
        if tp in _SIMPLE:
            return {"type": _SIMPLE[tp]}
        raise TypeError(f"no JSON schema for {tp!r}")

    def _annotated(self, tp: Any, inline: bool) -> Schema:
        base, *extras = get_args(tp)
        refs = [e.name for e in extras if isinstance(e, Ref)]
        if refs and not inline:
            out: Schema = {"$ref": f"#/components/schemas/{refs[0]}"}
        else:
            out = self.schema_of(base, inline=inline)
        for extra in extras:
            if isinstance(extra, str):
                out["description"] = extra
            elif isinstance(extra, Keywords):
                out.update(extra.items)
        if "enum" in out:
            out["enum"] = list(out["enum"])
            if "null" in out.get("type", ()) and None not in out["enum"]:
                out["enum"].append(None)
        return out

    def _object(self, tp: type) -> Schema:
        hints = get_type_hints(tp, include_extras=True)
        props: dict[str, Schema] = {}
        required = []
        for key, hint in hints.items():
            # NotRequired/Required as written win: under ``from __future__ import annotations``
            # Python 3.11 cannot see them when it computes __required_keys__
            origin = get_origin(hint)
            if origin is Required or (
                origin is not NotRequired and key in tp.__required_keys__  # type: ignore[attr-defined]
            ):
                required.append(key)
            while get_origin(hint) in (NotRequired, Required):
                (hint,) = get_args(hint)
            props[key] = self.schema_of(hint)
        out: Schema = {
            "type": "object",
            "required": required,
            "properties": props,
            "additionalProperties": False,
        }
        doc = tp.__doc__
        if doc and not doc.startswith(f"{tp.__name__}("):  # not the generated one
            out["description"] = " ".join(doc.split())
        return out

    def _union(self, members: tuple[Any, ...]) -> Schema:
        nullable = type(None) in members
        rest = [m for m in members if m is not type(None)]
        if set(rest) == {int, float}:
            out: Schema = {"type": "number"}
        elif len(rest) == 1:
            out = self.schema_of(rest[0])
        else:
            variants = [self.schema_of(m) for m in rest]
            if nullable:
                variants.append({"type": "null"})
            return {"oneOf": variants}
        if not nullable:
            return out
        if isinstance(out.get("type"), str) and "$ref" not in out:
            out = {**out, "type": [out["type"], "null"]}
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
            return out
        return {"anyOf": [out, {"type": "null"}]}
