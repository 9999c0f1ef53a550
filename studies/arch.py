"""The model families' configs, each declared once: the fixed architecture (`model.arch`) and the full config
a worker builds the model from; `ModelSpec` picks the arch by `family` (the registry: `studies.family`).

An arch (`PTArch`, `BertArch`, `UTArch`, `TauArch`) is what a study fixes. The model config (`PTConfig`,
`BertConfig`, `UTConfig`, `TauConfig`) is that arch plus what a trial adds: `vocab_size` (from the data),
`width`, `base_width` and `parametrization` (`ModelSize`) and the family's hparams (from `space`). The
workers' models (`workers/models/`) take these configs as they are; `studies` imports no torch.

Which widths an arch builds at is decided in one place, the arch's `width_steps` (PT: its scaled sizes
must stay integers; TauGPT: whole kv groups of heads): `width_step`, `width_error`, `rebase`, the model
configs' validation and the parameter counts of `studies.budget` all read it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

Parametrization = Literal["mup", "standard"]
_STRICT = ConfigDict(extra="forbid", frozen=True)
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]


class PTArch(BaseModel):
    """PT's fixed architecture: `PTConfig`'s fields except `vocab_size` (from `data`), `width`,
    `base_width` (from the phase and `tune`), `parametrization` (from `model`) and the six
    information weights (hparams, from `space`). Sizes are given at `tune.base_width`."""

    model_config = _STRICT

    n_channels: PosInt = Field(4, description="h at base_width (h ∝ d when paradigm is 'channels')")
    rank: PosInt = Field(16, description="r at base_width (r ∝ d when paradigm is 'rank')")
    n_iter: PosInt = Field(3, description="T, the MFVI iterations (parameters shared across them)")
    gamma: NonNegInt = Field(3, description="distance clip γ; K = 2γ+2 buckets (0: one per direction)")
    decomposition: Literal["uv", "uvw", "none"] = Field("uv", description="ternary factor: UVᵀ, UVW, full T")
    async_update: bool = Field(True, description="H, then Z from the new H; False: both from the last")
    block_msg: bool = Field(False, description="drop the head-side message G_head (w_head is then inert)")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="one rate, on Z logits and on H (async: probabilities; sync: logits)")
    stepsize_Z: float = Field(1.0, gt=0.0, le=1.0, description="MFVI step size α_Z: P = α·softmax + (1−α)·P_prev")
    stepsize_H: float = Field(1.0, gt=0.0, le=1.0, description="MFVI step size α_H on the H marginals")
    damping_Z: float = Field(0.0, ge=0.0, lt=1.0, description="MFVI damping β_Z: L_z = β·L_prev + (1−β)·new")
    damping_H: float = Field(0.0, ge=0.0, lt=1.0, description="MFVI damping β_H on the H logits")
    topic: Literal["none", "single_split"] = Field(
        "none", description="topic variables (the FFN analogue); 'none' makes w_topic, w_topic_z inert")
    n_topics: PosInt = Field(64, description="m at base_width (m ∝ d)")
    paradigm: Literal["channels", "rank"] = Field("channels", description="how PT widens: h ∝ d, or r ∝ d")
    tau_form: Literal["d_over_r", "base_normalized"] = Field(
        "d_over_r", description="μP temperature τ = d/r, or (d/r)/(d0/r0) (PT spec §3.4, [R])")
    output_init: Literal["inv_d", "inv_sqrt_d"] = Field(
        "inv_d", description="μP decoder init std ∝ 1/d, or ∝ 1/√d (PT spec §3.3, [R])")
    topic_coef: Literal["m_over_d", "one"] = Field(
        "m_over_d", description="μP topic-logit coefficient m/d, or 1 (PT spec §3.5, [R])")
    init_std_input: float = Field(1.0, gt=0, description="μP: std of S, width-independent")
    init_std_hidden: float = Field(0.25, gt=0, description="μP: std of U, V, B = init_std_hidden / √d")
    init_std_output: float = Field(
        1.0, gt=0, description="μP: decoder std = init_std_output / √d0 · (d0/d, or √(d0/d))")
    recompute: bool = Field(
        True, description="rebuild per-bucket contexts in backward instead of storing them (exact, less memory)")
    root: Literal[False] = Field(False, description="root-node variant (spec §2.4, SST): not implemented")

    @field_validator("root", mode="before")
    @classmethod
    def _no_root(cls, value: Any) -> Any:
        if value is not False:
            raise ValueError("the root-node variant (PT spec §2.4) is not implemented: set root: false")
        return value

    def scaled(self) -> tuple[str, ...]:
        """The sizes given at base_width that grow ∝ width: the paradigm's (n_channels or rank) and, with
        topics, n_topics."""
        return ("n_channels" if self.paradigm == "channels" else "rank",) + (("n_topics",) if self.topic != "none"
                                                                             else ())

    def width_steps(self, base_width: int) -> dict[str, int]:
        """`{size: step}`: a scaled size n stays an integer n·width/base_width at the multiples of its step."""
        return {n: base_width // math.gcd(getattr(self, n), base_width) for n in self.scaled()}

    def at_width(self, width: int, base_width: int) -> dict[str, int]:
        """The scaled sizes at `width` (a width `width_error` accepts)."""
        return {n: getattr(self, n) * width // base_width for n in self.scaled()}


class _EncoderArch(BaseModel):
    """What BERT and UT share (`workers/models/bert.py`): heads of a fixed size, GELU FFN, LN placement, the
    MLM head and mup's init options. Any width builds (heads = round(width / head_dim))."""

    model_config = _STRICT

    head_dim: PosInt = Field(32, description="fixed head size; heads = round(width / head_dim), ∝ width")
    ffn_mult: PosInt = Field(4, description="FFN width = ffn_mult · width")
    max_len: PosInt = Field(512, description="position rows; must be >= data.seq_len (set it equal: no unused rows)")
    norm: Literal["pre", "post"] = Field("pre", description="LayerNorm before each sublayer, or after (BERT)")
    tie_decoder: bool = Field(True, description="decoder weight = token embedding (BERT)")
    mlm_transform: bool = Field(True, description="BERT's dense + GELU + LN before the decoder")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on embeddings, attention and sublayers")
    zero_query: bool = Field(False, description="init option (mup's for μP): query projection at zero")
    zero_readout: bool = Field(
        False, description="init option (mup's for μP): the readouts at zero (an untied decoder; UT: the halting unit)")

    def width_steps(self, base_width: int) -> dict[str, int]:
        """No size constrains the width."""
        return {}

    def heads_at(self, width: int) -> int:
        """Heads at `width`: the nearest whole number of `head_dim`-sized heads, at least one."""
        return max(1, (width + self.head_dim // 2) // self.head_dim)


class BertArch(_EncoderArch):
    """BERT's fixed architecture."""

    n_layers: PosInt = Field(2, description="Transformer layers")


class UTArch(_EncoderArch):
    """The Universal Transformer's fixed architecture."""

    n_steps: PosInt = Field(4, description="T, applications of the one shared layer (ACT's maximum)")
    timing: Literal["sinusoidal", "learned"] = Field(
        "sinusoidal", description="position and timestep signals: sinusoidal (UT paper) or learned tables")
    act: bool = Field(False, description="adaptive computation time (halting per position)")
    act_threshold: float = Field(0.99, gt=0.0, le=1.0, description="ACT halts past this cumulative probability")
    act_penalty: float = Field(0.01, ge=0.0, description="τ, the ponder cost's weight in the loss")


class TauArch(BaseModel):
    """TauGPT's fixed architecture. Width grows by heads at a fixed head_dim (Tauformer spec §7.1)."""

    model_config = _STRICT

    n_layers: PosInt = Field(2, description="Transformer blocks")
    head_dim: PosInt = Field(32, description="D, fixed: also the Laplacian's size; heads = width / head_dim")
    kv_group: PosInt = Field(1, description="query heads per kv head (1: MHA); width must be a multiple of "
                                            "head_dim · kv_group")
    max_len: PosInt = Field(1024, description="RoPE rows: the longest sequence (prompt plus generated tokens)")
    attention: Literal["tau", "dot", "uniform"] = Field(
        "tau", description="'tau' (taumode), 'dot' (the dot-product twin) or 'uniform' (causal mean)")
    laplacian: Literal["chain", "knn", "file"] = Field(
        "chain", description="'chain' (path graph), 'knn' (feature-kNN of an (N, F) embedding .npy) or 'file'")
    laplacian_path: str | None = Field(None, description="the .npy read by laplacian 'knn' or 'file'")
    laplacian_rotate: bool = Field(False, description="use a random orthogonal conjugate of L (same spectrum)")
    tau_mode: Literal["calibrate", "fixed"] = Field(
        "calibrate", description="τ = median E of block-0 keys on the first batch, or the fixed `tau`")
    tau: float = Field(1.0, gt=0, description="τ when fixed, and before the first calibration")
    recalibrate_every: NonNegInt = Field(0, description="steps between τ recalibrations (0: only at step 0)")
    recalibrate_ema: float = Field(0.0, ge=0, lt=1, description="recalibration: τ ← ema·τ + (1 − ema)·median")
    learn_temperature: bool = Field(True, description="the per-head temperature is learned (exp(s_h))")
    qkv_clamp: float = Field(5.0, ge=0, description="clamp q, k, v to ±qkv_clamp (0: off)")
    logit_clamp: float = Field(50.0, ge=0, description="clamp the LM logits to ±logit_clamp (0: off)")
    rope_base: float = Field(10000.0, gt=0, description="RoPE base")
    embed_std: float = Field(1.0, gt=0, description="std of the token embedding")
    zero_proj: bool = Field(False, description="initialise the residual output projections at zero")
    laplacian_seed: NonNegInt = Field(0, description="seeds laplacian_rotate and the knn clustering")

    @model_validator(mode="after")
    def _path_with_file(self) -> TauArch:
        if (self.laplacian_path is None) != (self.laplacian == "chain"):
            raise ValueError(f"model.arch.laplacian_path must be set for laplacian {self.laplacian!r} and only then "
                             "(a .npy file: an (N, F) embedding matrix for 'knn', a (D, D) Laplacian for 'file')")
        if self.head_dim % 2:
            raise ValueError(f"model.arch.head_dim={self.head_dim} must be even (RoPE pairs channel i with i + D/2)")
        return self

    def width_steps(self, base_width: int) -> dict[str, int]:
        """Widths are whole kv groups of heads."""
        return {"head_dim · kv_group": self.head_dim * self.kv_group}


def nested(info: ValidationInfo) -> dict[str, Any]:
    """`model_validate`'s strict and context for a model validated inside a validator: the outer call's, so
    `StudySpec.model_validate_json(..., strict=True, context={"strict": True})` (the API) is strict throughout."""
    context = info.context if isinstance(info.context, dict) else {}
    return {"strict": True if context.get("strict") else None, "context": info.context}


Arch = PTArch | BertArch | UTArch | TauArch
"""The built-in families' arches (a registered family's arch is any pydantic model: `studies.family`)."""


def _registered(name: str) -> str:
    from studies.family import get_family  # the registry imports this module

    get_family(name)
    return name


class _FamilyName:
    """A registered family's name (`studies.family`): validated against the registry, offered as an enum."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_registered, core_schema.str_schema())

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        from studies.family import family_names

        return {"type": "string", "enum": family_names()}


ModelFamily = Annotated[str, _FamilyName]
"""A model family's name, one `studies.family.register`ed."""


class _FamilyArch:
    """A registered family's arch (`ModelSpec` validates it by family): its JSON schema offers every family's."""

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        from studies.family import FAMILIES

        arches = dict.fromkeys(f.arch for f in FAMILIES.values())  # each once, in registration order
        return handler(core_schema.union_schema([a.__pydantic_core_schema__ for a in arches]))


def width_step(arch: Arch, base_width: int) -> int:
    """Widths `arch` builds at are the multiples of this (1: any width)."""
    return math.lcm(*arch.width_steps(base_width).values())


def width_error(arch: Arch, base_width: int, width: int, where: str) -> str | None:
    """Why `width` cannot be built from `arch` tuned at `base_width` (None when it can; BERT and UT: any width;
    TauGPT: multiples of head_dim · kv_group; PT: widths at which every scaled size n·width/base_width is an
    integer)."""
    if width < 1:
        return f"{where}={width} must be a positive integer"
    for name, step in arch.width_steps(base_width).items():
        if width % step == 0:
            continue
        if isinstance(arch, TauArch):
            return (f"{where}={width} is not a multiple of model.arch.head_dim · kv_group = {step} (TauGPT widens "
                    f"by whole heads): use a multiple of {step}")
        base = getattr(arch, name)
        return (f"{where}={width} is incompatible with tune.base_width={base_width}: model.arch.{name}={base} "
                f"would scale to {base * width / base_width:g}, not an integer; use widths that are multiples of "
                f"{width_step(arch, base_width)}, or change model.arch.{name}")
    return None


def rebase(arch: Arch, base_width: int, new_base: int) -> Arch:
    """`arch` with its sizes given at `new_base` instead of `base_width` (the same models at every width).

    PT's scaled sizes are given at the base width (h = n_channels · width / base_width); moving the μP base
    to `new_base` (a compatible width) rescales them. BERT, UT and TauGPT have no such sizes.
    """
    if not isinstance(arch, PTArch):
        return arch
    error = width_error(arch, base_width, new_base, "the new base width")
    if error:
        raise ValueError(error)
    return arch.model_copy(update=arch.at_width(new_base, base_width))


def mup_error(arch: Arch, parametrization: str) -> str | None:
    """Why `arch` cannot run under `parametrization` (None when it can): PT's μP is specified for 'uv' only."""
    if isinstance(arch, PTArch) and parametrization == "mup" and arch.decomposition != "uv":
        return (f"model.arch.decomposition={arch.decomposition!r}: μP is specified for 'uv' only (PT spec §3.1); use "
                "decomposition: uv or parametrization: standard")
    return None


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
        errors = [width_error(arch, self.base_width, getattr(self, n), n) for n in ("width", "base_width")]
        errors.append(mup_error(arch, self.parametrization))
        found = [e for e in errors if e]
        if found:
            raise ValueError("; ".join(found))
        return self

    @property
    def width_mult(self) -> float:
        return self.width / self.base_width


class PTWeights(BaseModel):
    """PT's hparams but lr: the six information weights (PT spec §3.2), all 1 in the original PT."""

    model_config = _STRICT

    w_H: float = Field(1.0, description="the ternary → H message (the attention logits)")
    w_topic: float = Field(1.0, description="the binary → topic message (the topic logits)")
    w_unary: float = Field(1.0, description="the unary → Z message S")
    w_dep: float = Field(1.0, description="the ternary → Z message with the word as dependent (G_dep)")
    w_head: float = Field(1.0, description="the ternary → Z message with the word as head (G_head)")
    w_topic_z: float = Field(1.0, description="the binary → Z message (from the topic variables)")


class PTConfig(PTArch, ModelSize, PTWeights):
    """Everything `workers.models.pt.ProbabilisticTransformer` is built from, and its sizes at `width`."""

    @property
    def h(self) -> int:
        return self.at_width(self.width, self.base_width).get("n_channels", self.n_channels)

    @property
    def r(self) -> int:
        return self.at_width(self.width, self.base_width).get("rank", self.rank)

    @property
    def m(self) -> int:
        return self.at_width(self.width, self.base_width).get("n_topics", self.n_topics)

    @property
    def n_buckets(self) -> int:
        return 2 * self.gamma + 2  # γ = 0: one bucket per direction (the authors' dists = "")


class _EncoderHeads(Protocol):
    """What `_EncoderConfig.n_heads` needs of a config: its width and its arch's `heads_at`."""

    @property
    def width(self) -> int: ...

    def heads_at(self, width: int) -> int: ...


class _EncoderConfig(ModelSize):
    """BERT's and UT's hparams (mup's usual knobs) and heads (the arch's `heads_at`, mixed in beside it)."""

    init_std: float = Field(0.02, gt=0, description="standard: every weight; μP: embeddings, readout, hidden at d0")
    output_mult: float = Field(1.0, gt=0, description="multiplies the logits (μP: output_mult · d0/d)")
    attn_mult: float = Field(1.0, gt=0, description="multiplies the attention logits")

    @property
    def n_heads(self: _EncoderHeads) -> int:
        return self.heads_at(self.width)


class BertConfig(BertArch, _EncoderConfig):
    """Everything `workers.models.bert.Bert` is built from."""


class UTConfig(UTArch, _EncoderConfig):
    """Everything `workers.models.universal.UniversalTransformer` is built from."""


class TauConfig(TauArch, ModelSize):
    """Everything `workers.models.tauformer.TauGPT` is built from, and its heads."""

    init_std: float = Field(0.5, gt=0, description="matrices: std = init_std / √fan_in (reference: Kaiming gain 0.5)")
    output_mult: float = Field(1.0, gt=0, description="multiplies the logits (μP: output_mult · d0/d)")
    temperature: float = Field(0.03, gt=0, description="initial T_h (spec §3.2: ≈ the init λ spread at D = 64)")

    @property
    def n_heads(self) -> int:
        return self.width // self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads // self.kv_group


ModelConfig = PTConfig | BertConfig | UTConfig | TauConfig


class ModelSpec(BaseModel):
    """The model family, its parametrization and its fixed architecture (the arch class follows `family`)."""

    model_config = _STRICT

    family: ModelFamily = Field("pt", description="the model family (one registered in `studies.family`)")
    parametrization: Parametrization = Field("mup", description="'mup' (μP) or 'standard'")
    arch: Annotated[SerializeAsAny[Arch], _FamilyArch] = Field(
        None, validate_default=True, description="the fixed architecture: the family's arch (omitted: its defaults)")

    @field_validator("arch", mode="wrap")
    @classmethod
    def _arch_of_family(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        from studies.family import get_family

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
