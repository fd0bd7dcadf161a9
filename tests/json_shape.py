"""Check a JSON document against the subset of JSON Schema the UI's API schemas use (``conductor/ui/schemas.py``):
``$ref`` into ``components.schemas``, ``type`` (one or a list), ``required``, ``properties``, ``items``,
``prefixItems`` and ``additionalProperties``. Enough to prove every documented field is there with its type;
not a general validator."""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
                                       "integer": (int,), "number": (int, float), "null": (type(None),)}


def mismatches(doc: Any, schema: dict[str, Any], schemas: dict[str, dict[str, Any]], at: str = "$") -> list[str]:
    """Where ``doc`` does not have the shape of ``schema`` (empty when it does)."""
    if "$ref" in schema:
        return mismatches(doc, schemas[schema["$ref"].rsplit("/", 1)[1]], schemas, at)
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        ok = any(isinstance(doc, _TYPES[k]) and not (k in ("integer", "number") and isinstance(doc, bool))
                 for k in kinds)
        if not ok:
            return [f"{at}: {type(doc).__name__} is not {'/'.join(kinds)}"]
    out: list[str] = []
    if isinstance(doc, dict):
        out += [f"{at}: missing {k!r}" for k in schema.get("required", []) if k not in doc]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for k, v in doc.items():
            if k in props:
                out += mismatches(v, props[k], schemas, f"{at}.{k}")
            elif isinstance(extra, dict):
                out += mismatches(v, extra, schemas, f"{at}.{k}")
    if isinstance(doc, list):
        prefix = schema.get("prefixItems", [])
        for i, v in enumerate(doc):
            item = prefix[i] if i < len(prefix) else schema.get("items")
            if item is not None:
                out += mismatches(v, item, schemas, f"{at}[{i}]")
    return out
