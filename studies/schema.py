"""The JSON schema of a spec section that names a model family (`StudySpec`, a compare baseline): one variant per
registered family, told apart by `model.family`, each with that family's arch and space: the classes the registry
(`studies.family`) hands the validators, so the schema (and the API's OpenAPI document) accepts what validation
accepts, family by family.

JSON Schema has no discriminator on a nested field, so the section is a `oneOf` of complete object schemas, one
per family, whose `model.family` is a `const` (the default family's variant also matches an omitted model or
family; the others require it). Null is offered where validation takes it: `model.arch` and `space` (the
family's defaults). A study of a family no compare study takes has no `compare` section in its variant, and a
compare baseline's variants are the families a compare study takes.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

from pydantic import GetJsonSchemaHandler, SerializeAsAny
from pydantic_core import core_schema

from studies.family import FAMILIES, Family
from studies.space import Space

__all__ = ["FamilySpace", "by_family"]

NULL = {"type": "null"}


class _FamilySpaceSchema:
    """A registered family's space (the spec validates it by `model.family`), or null for its defaults."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        spaces = dict.fromkeys(f.space for f in FAMILIES.values())  # each once, in registration order
        return handler(core_schema.nullable_schema(core_schema.union_schema(
            [s.__pydantic_core_schema__ for s in spaces])))


FamilySpace = Annotated[SerializeAsAny[Space], _FamilySpaceSchema]
"""A family's search space: a validator picks the class by family (`studies.space.validate_space`)."""


def _or_null(family_class: Any, handler: GetJsonSchemaHandler, field: dict[str, Any]) -> dict[str, Any]:
    """`field` (a property's schema) narrowed to `family_class` or null, its description and default kept."""
    schema: dict[str, Any] = handler(core_schema.nullable_schema(family_class.__pydantic_core_schema__))
    return {**{k: v for k, v in field.items() if k in ("description", "default")}, **schema}


def _variant(section: dict[str, Any], model: dict[str, Any], family: Family, default: str, study: bool,
             handler: GetJsonSchemaHandler) -> dict[str, Any]:
    properties = section["properties"]
    narrowed = copy.deepcopy(model)
    narrowed["properties"]["family"] = {"const": family.name, "description": model["properties"]["family"].get(
        "description", ""), **({"default": default} if family.name == default else {})}
    narrowed["properties"]["arch"] = _or_null(family.arch, handler, model["properties"]["arch"])
    narrowed["description"] = properties["model"].get("description", narrowed.get("description", ""))
    required = list(section.get("required", []))
    if family.name != default:  # the default family is also the one of an omitted model or family
        narrowed["required"] = ["family"]
        required = [*required, "model"] if "model" not in required else required
    variant = {**section, "title": f"{section.get('title', '')} ({family.name})",
               "properties": {**properties, "model": narrowed,
                              "space": _or_null(family.space, handler, properties["space"])}}
    if study and not family.comparable:
        variant["properties"]["compare"] = {**properties["compare"], "anyOf": [NULL]}
    if required:
        variant["required"] = required
    return variant


def by_family(json_schema: dict[str, Any], handler: GetJsonSchemaHandler, default: str, study: bool) -> None:
    """Turn `json_schema`, a section's object schema with `model` and `space` properties, into a `oneOf` of its
    families' variants (module docstring): every family for a study (`study`), the families a compare study takes
    for a compare baseline. `default` is the family of an omitted `model.family`."""
    section = handler.resolve_ref_schema(json_schema)
    model = handler.resolve_ref_schema(section["properties"]["model"])
    families = [f for f in FAMILIES.values() if study or f.comparable]
    variants = [_variant(section, model, f, default, study, handler) for f in families]
    keep: dict[str, Any] = {k: section[k] for k in ("title", "description") if k in section}
    section.clear()
    section.update(keep, oneOf=variants)
