"""Loading YAML config files into pydantic models with errors a person can act on."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, Tag, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the field and the fix."""


def read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc


def validate(model: type[Model], document: object, source: Path | str) -> Model:
    """`document` as a `model`, or a ConfigError with one line per field that is wrong:
    where it is in the document, what is wrong and, for a key the model does not know,
    the keys it does (the nearest first)."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        problems: dict[str, list[str]] = {}
        for error in exc.errors():
            loc = _in_document(document, error)
            field = ".".join(str(part) for part in loc) or "(top level)"
            problems.setdefault(field, []).append(_said(model, loc, error))
        # a value that is none of a union's types fails once per type: one line for it
        raise ConfigError("\n".join(f"{source}: {field}: {'; or '.join(dict.fromkeys(said))}"
                                     for field, said in problems.items())) from None


def _in_document(document: object, error: dict) -> tuple:
    """The error's location with the parts that are not in the document left out: the
    labels pydantic gives a union's members (``str``, ``SuiteEntry``), never a key the
    user wrote. A missing key is kept."""
    node, kept = document, []
    for i, part in enumerate(error["loc"]):
        if isinstance(node, dict) and part in node or \
                isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            kept.append(part)
        elif i == len(error["loc"]) - 1 and error["type"] == "missing":
            kept.append(part)
    return tuple(kept)


def _said(model: type[BaseModel], loc: tuple, error: dict) -> str:
    shown = error["type"].endswith("_type") or error["type"] == "literal_error"
    got = f", got {error['input']!r}" if shown else ""
    if error["type"] == "extra_forbidden" and (known := _keys_at(model, error["loc"][:-1])):
        near = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return f"unknown key {loc[-1]!r}; {hint}known: {', '.join(known)}"
    return error["msg"].removeprefix("Value error, ") + got


def _keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the model takes at pydantic's `loc` (a model's fields), [] when it is not
    a model's."""
    kinds: list[Any] = [model]
    for part in loc:
        kinds = [inner for kind in kinds for inner in _inside(kind, part)]
    return sorted({name for kind in kinds for found in _models(kind)
                   for name in found.model_fields})


def _models(kind: Any) -> list[type[BaseModel]]:
    """The models a value of type `kind` may be (through Annotated and unions)."""
    if typing.get_origin(kind) is typing.Annotated:
        return _models(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [found for arg in typing.get_args(kind) for found in _models(arg)]
    return [kind] if _is_model(kind) else []


def _is_model(kind: Any) -> bool:
    # list[X] is a type to isinstance on Python 3.10, and issubclass refuses it
    return typing.get_origin(kind) is None and isinstance(kind, type) \
        and issubclass(kind, BaseModel)


def _inside(kind: Any, part: object) -> list[Any]:
    """What a value of type `kind` holds under key or index `part` (every candidate of a
    union, or the member `part` labels: pydantic puts a union member's label in `loc`)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Annotated:
        return _inside(args[0], part)
    if origin in (typing.Union, types.UnionType):
        labelled = [arg for arg in args if part in _labels(arg)]
        return labelled or [inner for arg in args for inner in _inside(arg, part)]
    if _is_model(kind):
        field = kind.model_fields.get(str(part))
        return [field.annotation] if field else []
    if origin in (list, dict):
        return [args[-1]] if args else []
    return []


def _labels(kind: Any) -> set[str]:
    """What pydantic calls a union member in an error's `loc`: its tag, or its type's name."""
    if typing.get_origin(kind) is typing.Annotated:
        tags = {m.tag for m in typing.get_args(kind)[1:] if isinstance(m, Tag)}
        return tags or _labels(typing.get_args(kind)[0])
    return {getattr(kind, "__name__", str(kind))}


def load_model(model: type[Model], path: Path) -> Model:
    return validate(model, read_yaml(path), path)
