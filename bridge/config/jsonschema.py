"""The config's JSON Schema, generated from the structs of `schema.py`: what an editor
validates and completes a config with (`mcp-bridge config schema`; the committed
`config/servers.schema.json`).

It checks shapes (keys, types, bounds, choices); the rules across keys (a token's server
names exist, TLS files are readable, ...) stay the loader's. Each key's description is
the comment beside it in `schema.py`. A number, a boolean or a duration may also be
written as a `${VAR}` the loader fills in.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import tokenize
from functools import cache
from typing import Any

import msgspec
import msgspec.inspect as mi

from bridge.config import schema
from bridge.config.schema import SERVER_NAME, Config, Duration, Size

_INTERPOLATED = {"type": "string", "pattern": r"\$\{"}  # filled in by the loader (config/load.py)


@cache
def comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line in the struct's source."""
    source = inspect.getsource(cls)
    notes: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.string.startswith("# fmt"):
            notes[token.start[0]] = token.string.lstrip("# ").strip()
    found = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.lineno in notes:
            found[node.target.id] = notes[node.lineno]
    return found


def _bounds(t: mi.IntType | mi.FloatType) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in (("ge", "minimum"), ("le", "maximum"), ("gt", "exclusiveMinimum"), ("lt", "exclusiveMaximum")):
        if (value := getattr(t, name)) is not None:
            out[key] = value
    return out


def _scalar(kind: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [kind, _INTERPOLATED]}


def _of(t: mi.Type) -> dict[str, Any]:
    match t:
        case mi.StructType():
            return _struct(t)
        case mi.DictType(value_type=value):
            return {"type": "object", "additionalProperties": _of(value)}
        case mi.VarTupleType(item_type=item) | mi.ListType(item_type=item):
            return {"type": "array", "items": _of(item)}
        case mi.UnionType(types=types):
            return {"anyOf": [_of(member) for member in types]}
        case mi.LiteralType(values=values):
            return {"enum": list(values)}
        case mi.StrType():
            return {"type": "string", **({"pattern": t.pattern} if t.pattern else {})}
        case mi.BoolType():
            return _scalar({"type": "boolean"})
        case mi.IntType():
            return _scalar({"type": "integer", **_bounds(t)})
        case mi.FloatType():
            return _scalar({"type": "number", **_bounds(t)})
        case mi.NoneType():
            return {"type": "null"}
        case mi.CustomType(cls=cls) if cls is Duration:
            return {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": schema._DURATION.pattern}, _INTERPOLATED]}
        case mi.CustomType(cls=cls) if cls is Size:
            return {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": schema._SIZE.pattern}, _INTERPOLATED]}
    raise TypeError(f"no JSON Schema for {t!r}")


def _default(value: Any) -> Any:
    return msgspec.to_builtins(value, enc_hook=lambda v: float(v) if isinstance(v, float) else int(v))


def _struct(t: mi.StructType) -> dict[str, Any]:
    notes = comments(t.cls)
    properties = {}
    for field in t.fields:
        prop = _of(field.type)
        if field.name in notes:
            prop["description"] = notes[field.name]
        if field.default is not msgspec.NODEFAULT and not isinstance(field.default, msgspec.Struct):
            prop["default"] = _default(field.default)
        properties[field.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if t.cls.__doc__:  # its own docstring (a class's is not inherited)
        out["description"] = " ".join(t.cls.__doc__.split())
    required = [f.name for f in t.fields if f.required]
    if required:
        out["required"] = required
    return out


def config_schema() -> dict[str, Any]:
    root = _struct(mi.type_info(Config))  # type: ignore[arg-type]
    root["properties"]["servers"]["propertyNames"] = {"pattern": SERVER_NAME.pattern}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "mcp-bridge config", **root}


def render() -> str:
    return json.dumps(config_schema(), indent=2) + "\n"
