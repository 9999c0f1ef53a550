"""What a study names of its model: `ModelSpec` (a registered family, its parametrization and its arch) and the
family's search space; both validated against the registry (`studies.family`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

from studies.arch import _STRICT, Parametrization, mup_error, nested
from studies.family import FAMILIES, family_names, get_family
from studies.space import Space


def _registered(name: str) -> str:
    get_family(name)
    return name


class _FamilyName:
    """A registered family's name (`studies.family`): validated against the registry, offered as an enum."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_registered, core_schema.str_schema())

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {"type": "string", "enum": family_names()}


ModelFamily = Annotated[str, _FamilyName]
"""A model family's name, one `studies.family.register`ed."""


class _FamilyArch:
    """A registered family's arch (`ModelSpec` validates it by family), or null for its defaults: its JSON schema
    offers every family's (`StudySpec`'s schema narrows it to the family's)."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        arches = dict.fromkeys(f.arch for f in FAMILIES.values())  # each once, in registration order
        return handler(core_schema.nullable_schema(core_schema.union_schema(
            [a.__pydantic_core_schema__ for a in arches])))


class ModelSpec(BaseModel):
    """The model family, its parametrization and its fixed architecture (the arch class follows `family`)."""

    model_config = _STRICT

    family: ModelFamily = Field("pt", description="the model family (one registered in `studies.family`)")
    parametrization: Parametrization = Field("mup", description="'mup' (μP) or 'standard'")
    arch: Annotated[SerializeAsAny[BaseModel], _FamilyArch] = Field(
        None, validate_default=True, description="the fixed architecture: the family's arch (omitted: its defaults)")

    @field_validator("arch", mode="wrap")
    @classmethod
    def _arch_of_family(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        if "family" not in info.data:  # the family failed validation: its error names the registered ones
            return value
        arch_cls = get_family(info.data["family"]).arch
        if value is None:
            return arch_cls()
        if isinstance(value, arch_cls):
            return value
        return arch_cls.model_validate(value.model_dump() if isinstance(value, BaseModel) else value,
                                       **nested(info))

    @model_validator(mode="after")
    def _mup_needs_uv(self) -> ModelSpec:
        error = mup_error(self.arch, self.parametrization)
        if error:
            raise ValueError(error)
        return self


def space_class(family: str) -> type[Space]:
    """The search-space class of model `family` (its registration in `studies.family`)."""
    return get_family(family).space


def validate_space(value: Any, family: str, **options: Any) -> Space:
    """`value` (None, a dict or a space) as `family`'s space; a space of another family is re-validated
    (`options`: `model_validate`'s strict and context)."""
    cls = space_class(family)
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return cls.model_validate(value, **options)
