"""What a decision may answer: a closed list of outputs or a small JSON-schema subset."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evaluator.engine import parsing
from evaluator.engine.errors import InvalidDefinitionError

__all__ = ["InvalidOutputError", "OutputSpec"]

_SCHEMA_TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "null"})
_SCHEMA_KEYS = frozenset(
    {
        "type",
        "enum",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minimum",
        "maximum",
        "maxLength",
        "maxItems",
        "description",
    }
)
_MAX_SCHEMA_DEPTH = 8


class InvalidOutputError(ValueError):
    """A model answer that does not fit the decision's output specification."""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """Either ``allowed_outputs`` (exact strings) or ``schema`` (a JSON-schema subset)."""

    allowed_outputs: tuple[str, ...] | None = None
    schema: Mapping[str, Any] | None = None

    @classmethod
    def from_decision(cls, doc: Mapping[str, Any], where: str) -> OutputSpec:
        """Read ``allowedOutputs`` or ``outputSchema`` (exactly one) from a decision document."""
        has_allowed = "allowedOutputs" in doc
        has_schema = "outputSchema" in doc
        if has_allowed == has_schema:
            raise InvalidDefinitionError(
                f"{where}.allowedOutputs", "give exactly one of allowedOutputs and outputSchema"
            )
        if has_allowed:
            at = f"{where}.allowedOutputs"
            items = parsing.sequence(doc["allowedOutputs"], at, min_items=1, max_items=256)
            outputs = tuple(
                parsing.text(item, f"{at}[{index}]", max_length=1000)
                for index, item in enumerate(items)
            )
            if len(set(outputs)) != len(outputs):
                raise InvalidDefinitionError(at, "must not repeat an output")
            return cls(allowed_outputs=outputs)
        schema = doc["outputSchema"]
        _check_schema(schema, f"{where}.outputSchema", depth=0)
        return cls(schema=schema)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields this spec was read from."""
        if self.allowed_outputs is not None:
            return {"allowedOutputs": list(self.allowed_outputs)}
        return {"outputSchema": self.schema}

    def parse(self, answer: Any) -> Any:
        """Turn an adapter's answer into the decision's output, or raise ``InvalidOutputError``."""
        if self.allowed_outputs is not None:
            if not isinstance(answer, str):
                raise InvalidOutputError("answer is not text")
            stripped = answer.strip()
            if stripped in self.allowed_outputs:
                return stripped
            # Models often echo a choice in another case; accept it only when unambiguous.
            folded = [
                choice
                for choice in self.allowed_outputs
                if choice.casefold() == stripped.casefold()
            ]
            if len(folded) == 1:
                return folded[0]
            raise InvalidOutputError("answer is not one of the allowed outputs")
        assert self.schema is not None
        value = answer
        if isinstance(answer, str) and self.schema.get("type") != "string":
            try:
                value = json.loads(answer)
            except ValueError as error:
                raise InvalidOutputError("answer is not JSON") from error
        _check_value(value, self.schema, "output")
        return value


def _check_schema(schema: Any, where: str, *, depth: int) -> None:
    if depth > _MAX_SCHEMA_DEPTH:
        raise InvalidDefinitionError(where, f"nests deeper than {_MAX_SCHEMA_DEPTH} levels")
    schema = parsing.mapping(schema, where)
    parsing.known_keys(schema, _SCHEMA_KEYS, where)
    kind = parsing.required(schema, "type", where)
    # A list or object here is unhashable: check the type before looking it up.
    if not isinstance(kind, str) or kind not in _SCHEMA_TYPES:
        raise InvalidDefinitionError(f"{where}.type", f"must be one of {sorted(_SCHEMA_TYPES)}")
    if "enum" in schema:
        parsing.sequence(schema["enum"], f"{where}.enum", min_items=1, max_items=256)
    for bound in ("minimum", "maximum"):
        if bound in schema:
            parsing.number(schema[bound], f"{where}.{bound}", minimum=-math.inf, maximum=math.inf)
    for bound in ("maxLength", "maxItems"):
        if bound in schema:
            parsing.integer(schema[bound], f"{where}.{bound}", minimum=0, maximum=10_000_000)
    if "description" in schema:
        parsing.text(schema["description"], f"{where}.description", allow_empty=True)
    if "additionalProperties" in schema:
        parsing.boolean(schema["additionalProperties"], f"{where}.additionalProperties")
    if "properties" in schema:
        properties = parsing.mapping(schema["properties"], f"{where}.properties")
        for name, sub in properties.items():
            _check_schema(sub, f"{where}.properties.{name}", depth=depth + 1)
    if "required" in schema:
        names = parsing.sequence(schema["required"], f"{where}.required", max_items=1000)
        for index, name in enumerate(names):
            parsing.text(name, f"{where}.required[{index}]", max_length=1000)
    if "items" in schema:
        _check_schema(schema["items"], f"{where}.items", depth=depth + 1)


def _check_value(value: Any, schema: Mapping[str, Any], where: str) -> None:
    kind = schema["type"]
    if not _has_type(value, kind):
        raise InvalidOutputError(f"{where} is not of type {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise InvalidOutputError(f"{where} is not one of the enumerated values")
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise InvalidOutputError(f"{where} is below its minimum")
        if "maximum" in schema and value > schema["maximum"]:
            raise InvalidOutputError(f"{where} is above its maximum")
    elif kind == "string":
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise InvalidOutputError(f"{where} is longer than maxLength")
    elif kind == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise InvalidOutputError(f"{where} has more than maxItems items")
        if "items" in schema:
            for index, item in enumerate(value):
                _check_value(item, schema["items"], f"{where}[{index}]")
    elif kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise InvalidOutputError(f"{where}.{name} is missing")
        if schema.get("additionalProperties", True) is False:
            extra = set(value) - set(properties)
            if extra:
                raise InvalidOutputError(f"{where} has properties outside the schema")
        for name, sub in properties.items():
            if name in value:
                _check_value(value[name], sub, f"{where}.{name}")


def _has_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    return value is None
