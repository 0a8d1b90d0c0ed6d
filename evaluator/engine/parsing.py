"""Field-named readers for JSON documents; every failure is an ``InvalidDefinitionError``."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from evaluator.engine.errors import InvalidDefinitionError

IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidDefinitionError(field, "must be an object")
    for key in value:
        if not isinstance(key, str):
            raise InvalidDefinitionError(field, "keys must be strings")
    return value


def known_keys(doc: Mapping[str, Any], allowed: Iterable[str], field: str) -> None:
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise InvalidDefinitionError(_join(field, unknown[0]), "unknown field")


def required(doc: Mapping[str, Any], key: str, field: str) -> Any:
    if key not in doc:
        raise InvalidDefinitionError(_join(field, key), "is required")
    return doc[key]


def identifier(value: Any, field: str) -> str:
    if not isinstance(value, str) or not IDENTIFIER.match(value):
        raise InvalidDefinitionError(
            field, "must be 1-128 characters of letters, digits, '.', '_', ':' or '-'"
        )
    return value


def text(value: Any, field: str, *, max_length: int = 100_000, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidDefinitionError(field, "must be a string")
    if not allow_empty and not value.strip():
        raise InvalidDefinitionError(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidDefinitionError(field, f"must be at most {max_length} characters")
    return value


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidDefinitionError(field, "must be true or false")
    return value


def integer(value: Any, field: str, *, minimum: int, maximum: int) -> int:
    # bool is an int subclass; JSON true is never a count.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDefinitionError(field, "must be an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise InvalidDefinitionError(field, "must be an integer")
        value = int(value)
    if value < minimum or value > maximum:
        raise InvalidDefinitionError(field, f"must be between {minimum} and {maximum}")
    return value


def number(value: Any, field: str, *, minimum: float, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDefinitionError(field, "must be a number")
    try:
        # A JSON integer literal may be far beyond any float.
        as_float = float(value)
    except OverflowError:
        raise InvalidDefinitionError(field, "must be finite") from None
    if not math.isfinite(as_float):
        raise InvalidDefinitionError(field, "must be finite")
    if as_float < minimum or as_float > maximum:
        raise InvalidDefinitionError(field, f"must be between {minimum:g} and {maximum:g}")
    return as_float


def sequence(value: Any, field: str, *, max_items: int, min_items: int = 0) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise InvalidDefinitionError(field, "must be a list")
    if len(value) < min_items:
        raise InvalidDefinitionError(field, f"must hold at least {min_items} item(s)")
    if len(value) > max_items:
        raise InvalidDefinitionError(field, f"must hold at most {max_items} items")
    return list(value)


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key
