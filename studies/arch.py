"""What every family's architecture and model config share: the `Arch` base, `ModelSize` (what a trial adds to an
arch) and the width rules (`studies.model.ModelSpec` names a family, its parametrization and its arch). Each
family's own arch and config live in its module under `studies/families/` (the registry: `studies.family`).

An arch (e.g. `studies.families.pt.PTArch`) is what a study fixes. A model config (e.g. `PTConfig`) is that arch
plus what a trial adds: `vocab_size` (from the data), `width`, `base_width` and `parametrization` (`ModelSize`) and
the family's hparams (from its space). The workers' models (`workers/models/`) take these configs as they are;
`studies` imports no torch.

Which widths an arch builds at is decided in one place, the arch's `width_steps` (PT: its scaled sizes
must stay integers; TauGPT: whole kv groups of heads): `width_step`, `width_error`, `rebase`, the model
configs' validation and the parameter counts of `studies.budget` all read it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    model_serializer,
    model_validator,
)

Parametrization = Literal["mup", "standard"]
Optimizer = Literal["adamw", "muon"]  # train.optimizer's values
DepthParametrization = Literal["none", "completep"]
DEPTH_SWEEP: tuple[DepthParametrization, ...] = ("completep", "none")
"""The depth parametrizations a validate depth sweep (`validate.depths`) compares: CompleteP, and none beside it."""
DEPTH_ALPHA: dict[str, float] = {"completep": 1.0}
"""The residual-branch exponent α of each depth parametrization (CompleteP, Dey et al. 2025, arXiv 2505.01618,
§3 and Table 1: α = 1; `none` scales nothing with depth)."""
_STRICT = ConfigDict(extra="forbid", frozen=True)
PosInt = Annotated[int, Field(gt=0)]


def _increasing(widths: list[int]) -> list[int]:
    """`widths` unchanged, or a `ValueError` if they are not strictly increasing."""
    if any(b <= a for a, b in zip(widths, widths[1:], strict=False)):
        raise ValueError(f"widths {widths} must be strictly increasing, e.g. [512, 1024, 2048]")
    return widths


Widths = Annotated[list[PosInt], AfterValidator(_increasing)]
NonNegInt = Annotated[int, Field(ge=0)]
ANY_LENGTH = "any length"
"""The `Arch.context_field` of a model that takes sequences of any length (PT: clipped distance buckets, no
positions)."""


Later = tuple[tuple[str, ...], ...]  # groups of fields, each added to a section at once (`LaterFields`)


class LaterFields(BaseModel):
    """A spec section with fields added after specs' content hashes were fixed: `later`, groups of field names (each
    group added at once). A group whose fields are all at their declared defaults is left out of every dump (the
    YAML, the API's stored spec, trial configs), so a spec that does not use it keeps its content hash
    (`StudySpec.content_hash` hashes the dump), its trials their Tune configs and MLflow params. A new field that a
    study may leave at its default is added to its section's `later`; the one rule for every section (and the
    spec's own `compare`: `StudySpec.as_dict`, whose JSON schema a serializer would hide)."""

    later: ClassVar[Later] = ()

    @model_serializer(mode="wrap")
    def _leave_out_later_defaults(self, handler: Any) -> Any:
        return without_later_defaults(self, handler(self))


def without_later_defaults(model: Any, out: Any) -> Any:
    """`out`, the dump of `model`, without each group of `model.later` whose fields are all at their defaults."""
    fields = type(model).model_fields
    for group in model.later if isinstance(out, dict) else ():
        if all(getattr(model, name) == fields[name].default for name in group):
            for name in group:
                out.pop(name, None)
    return out


class Arch(BaseModel):
    """The base of a family's fixed architecture: strict, frozen, and the hooks the width rules and the spec call.
    Each hook has a default; a plain pydantic model with a `width_steps` method also serves as an arch (it gets the
    defaults)."""

    model_config = _STRICT
    finer_steps: ClassVar[str] = ""  # how to get a finer width step, added to the budget solver's error
    # the arch field holding the longest sequence the model takes (learned or RoPE positions: max_len, n_positions,
    # block_size), checked against data.seq_len by the spec (`context_error`); ANY_LENGTH: the model takes any;
    # None: not declared (every built-in declares it), and nothing checks the context before a trial runs it
    context_field: ClassVar[str | None] = None

    def context(self) -> tuple[str, int] | None:
        """The declared context: (where the spec keeps it, under model.arch; its value), or None (none declared).
        The default reads `context_field`; an arch that keeps it elsewhere (`hf`: in its config) overrides this."""
        name = self.context_field
        value = getattr(self, name, None) if name not in (None, ANY_LENGTH) else None
        return (name, value) if name and isinstance(value, int) else None

    def width_steps(self, base_width: int) -> dict[str, int]:
        """`{size: step}`: the widths this arch builds at are the multiples of each step (none: any width)."""
        return {}

    def width_advice(self, where: str, width: int, base_width: int, name: str, step: int) -> str:
        """Why `width` (not a multiple of `step`, the step of size `name`) cannot be built, and the fix."""
        return _scaled_size_advice(self, where, width, base_width, name, step)

    def rebased(self, base_width: int, new_base: int) -> Self:
        """This arch with its sizes given at `new_base` instead of `base_width` (none given at the base: itself;
        a `ValueError` when `new_base` cannot be built)."""
        return self

    def mup_error(self, parametrization: str) -> str | None:
        """Why this arch cannot run under `parametrization` (None when it can)."""
        return None


class DepthArch(Arch, LaterFields):
    """An arch whose residual blocks can be scaled with depth (BERT, UT, TauGPT): `depth_parametrization` and
    `base_depth`. The rules live in the model files (`workers/models/common.py: MuReadout.depth_*`, the blocks'
    `branch` multiplier); `depth_field` names the arch's depth L (UT: its recurrent steps).

    At `none` (the default) both fields are left out of the arch's dump (`LaterFields`)."""

    later: ClassVar[Later] = (("depth_parametrization", "base_depth"),)
    depth_field: ClassVar[str] = "n_layers"
    depth_parametrization: DepthParametrization = Field(
        "none", description="'none' (blocks unscaled) or 'completep' (CompleteP, α = 1: each residual branch × "
                            "base_depth/depth, with its per-block lr and Adam-ε rules)")
    base_depth: PosInt | None = Field(
        None, description="L0, the depth the hparams are tuned at (omitted: the arch's own depth, so depth_mult = 1)")

    @model_validator(mode="after")
    def _depth_rules(self) -> Self:
        if self.depth_parametrization == "none" and self.base_depth is not None:
            raise ValueError(f"model.arch.base_depth={self.base_depth} is set but model.arch.depth_parametrization "
                             "is 'none', which scales nothing with depth: set depth_parametrization: completep, or "
                             "drop base_depth")
        if self.depth_parametrization != "none" and getattr(self, "norm", "pre") != "pre":
            raise ValueError(f"model.arch.depth_parametrization={self.depth_parametrization!r} needs pre-LN blocks "
                             "(CompleteP scales the residual branch x + F(LN(x))/L; a post-LN block renormalises the "
                             "stream after every branch): set model.arch.norm: pre, or depth_parametrization: none")
        return self

    def at_depth(self, depth: int, depth_parametrization: DepthParametrization) -> Self:
        """This arch with `depth_field` = `depth` under `depth_parametrization`: at completep, base_depth is this
        arch's (else its own depth, the depth the hparams are tuned at); at none, nothing scales with depth."""
        data = {**self.model_dump(), self.depth_field: depth, "depth_parametrization": depth_parametrization,
                "base_depth": (self.base_depth or self.depth) if depth_parametrization != "none" else None}
        return type(self).model_validate(data)

    @property
    def depth(self) -> int:
        """L: the number of residual blocks applied (UT: steps of its one shared block)."""
        value: int = getattr(self, self.depth_field)
        return value

    @property
    def depth_mult(self) -> float:
        """m_L = depth / base_depth (1 when base_depth is omitted)."""
        return self.depth / (self.base_depth or self.depth)

    @property
    def depth_alpha(self) -> float:
        """α of the depth parametrization (0 at `none`: every depth factor is 1)."""
        return DEPTH_ALPHA.get(self.depth_parametrization, 0.0)


def _scaled_size_advice(arch: BaseModel, where: str, width: int, base_width: int, name: str, step: int) -> str:
    base = getattr(arch, name, None)
    if not isinstance(base, int) or width == base_width:  # at the base nothing scales: the step divides the width
        return f"{where}={width} is not a multiple of {step} (model.arch's {name}): use a multiple of {step}"
    return (f"{where}={width} is incompatible with tune.base_width={base_width}: model.arch.{name}={base} "
            f"would scale to {base * width / base_width:g}, not an integer; use widths that are multiples of "
            f"{width_step(arch, base_width)}, or change model.arch.{name}")


def nested(info: ValidationInfo) -> dict[str, Any]:
    """`model_validate`'s strict and context for a model validated inside a validator: the outer call's, so
    `StudySpec.model_validate_json(..., strict=True, context={"strict": True})` (the API) is strict throughout."""
    context = info.context if isinstance(info.context, dict) else {}
    return {"strict": True if context.get("strict") else None, "context": info.context}


def width_steps(arch: BaseModel, base_width: int) -> dict[str, int]:
    """`arch.width_steps(base_width)`: every registered arch has the method (`Arch`'s, or its own)."""
    method = getattr(arch, "width_steps", None)
    if method is None:
        raise TypeError(f"{type(arch).__name__} has no width_steps(base_width) method: subclass studies.arch.Arch")
    steps: dict[str, int] = method(base_width)
    return steps


def width_step(arch: BaseModel, base_width: int) -> int:
    """Widths `arch` builds at are the multiples of this (1: any width)."""
    return math.lcm(*width_steps(arch, base_width).values())


def width_error(arch: BaseModel, base_width: int, width: int, where: str) -> str | None:
    """Why `width` cannot be built from `arch` tuned at `base_width` (None when it can; BERT and UT: any width;
    TauGPT: multiples of head_dim · kv_group; PT: widths at which every scaled size n·width/base_width is an
    integer)."""
    if width < 1:
        return f"{where}={width} must be a positive integer"
    for name, step in width_steps(arch, base_width).items():
        if width % step == 0:
            continue
        if isinstance(arch, Arch):
            return arch.width_advice(where, width, base_width, name, step)
        return _scaled_size_advice(arch, where, width, base_width, name, step)
    return None


def context_length(arch: BaseModel) -> tuple[str, int] | None:
    """The arch's declared context (`Arch.context`) and its value; None where it declares none or any length."""
    if isinstance(arch, Arch):
        return arch.context()
    name = getattr(type(arch), "context_field", None)
    value = getattr(arch, name, None) if name not in (None, ANY_LENGTH) else None
    return (name, value) if name and isinstance(value, int) else None


def context_error(arch: BaseModel, seq_len: int, where: str = "model") -> str | None:
    """Why sequences of `seq_len` tokens do not fit `arch` (`where`.arch: `model`, a compare baseline's) and the fix;
    None when they fit or nothing is declared to check them against."""
    found = context_length(arch)
    if found is None or found[1] >= seq_len:
        return None
    field = f"{where}.arch.{found[0]}"
    return (f"data.seq_len {seq_len} exceeds {field} {found[1]}, the longest sequence the model takes: set {field} "
            f"to at least {seq_len}, or lower data.seq_len")


def context_line(arch: BaseModel, seq_len: int, family: str) -> str:
    """What the plan says of the context: the declared field against data.seq_len, any length, or not declared."""
    found = context_length(arch)
    if found is not None:
        return f"data.seq_len {seq_len} within model.arch.{found[0]} {found[1]}"
    if getattr(type(arch), "context_field", None) == ANY_LENGTH:
        return f"data.seq_len {seq_len}; model family {family!r} takes sequences of any length"
    return (f"not declared: model family {family!r} names no arch field holding its longest sequence "
            f"(Arch.context_field), so data.seq_len {seq_len} is unchecked until its first trial runs it")


def rebase(arch: BaseModel, base_width: int, new_base: int) -> BaseModel:
    """`arch` with its sizes given at `new_base` instead of `base_width` (the same models at every width).

    PT's scaled sizes are given at the base width (h = n_channels · width / base_width); moving the μP base
    to `new_base` (a compatible width) rescales them. BERT, UT and TauGPT have no such sizes.
    """
    return arch.rebased(base_width, new_base) if isinstance(arch, Arch) else arch


def mup_error(arch: BaseModel, parametrization: str) -> str | None:
    """Why `arch` cannot run under `parametrization` (None when it can; PT's μP is specified for 'uv' only)."""
    return arch.mup_error(parametrization) if isinstance(arch, Arch) else None


# ----------------------------------------------------------------------------- the model configs
class ModelSize(BaseModel):
    """What a trial adds to every family's arch: the vocabulary, the width, the μP base and the parametrization."""

    model_config = _STRICT

    vocab_size: PosInt = Field(description="token ids: the data's vocabulary")
    width: PosInt = Field(64, description="d, the model width")
    base_width: PosInt = Field(description="d0, the μP base the hparams are tuned at (omitted: width)")
    parametrization: Parametrization = Field("standard", description="'standard' or 'mup' (μP)")

    @model_validator(mode="before")
    @classmethod
    def _base_is_width(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("base_width") is None:
            data = {**data, "base_width": data.get("width", cls.model_fields["width"].default)}
        return data

    @model_validator(mode="after")
    def _buildable(self) -> ModelSize:
        arch: Any = self  # a config is its arch too (`PTConfig(PTArch, ModelSize, ...)`)
        sizes = ("width", "base_width") if self.base_width != self.width else ("width",)  # one value: said once
        errors = [width_error(arch, self.base_width, getattr(self, n), n) for n in sizes]
        errors.append(mup_error(arch, self.parametrization))
        found = [e for e in errors if e]
        if found:
            raise ValueError("; ".join(found))
        return self

    @property
    def width_mult(self) -> float:
        return self.width / self.base_width
