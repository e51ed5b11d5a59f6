"""Loading YAML config files into pydantic models with errors a person can act on."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

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
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]) or "(top level)"
            got = f", got {error['input']!r}" if error["type"].endswith("_type") else ""
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{source}: {field}: {message}{got}")
        raise ConfigError("\n".join(problems)) from None


def load_model(model: type[Model], path: Path) -> Model:
    return validate(model, read_yaml(path), path)
