"""The model families' fixed architectures (`model.arch`) and `ModelSpec`, which picks one by `family`.

Each arch mirrors its worker dataclass without importing it (`studies` imports no torch): `PTArch` ↔
`workers.models.pt.PTConfig`, `BertArch` ↔ `workers.models.bert.BertConfig`, `UTArch` ↔
`workers.models.universal.UTConfig`, `TauArch` ↔ `workers.models.tauformer.TauConfig`, each minus
`vocab_size` (from `data`), `width`, `base_width` (from the phase and `tune`), `parametrization` (from
`model`) and the family's hparams (from `space`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

ModelFamily = Literal["pt", "bert", "ut", "tauformer"]
MODEL_FAMILIES: tuple[str, ...] = get_args(ModelFamily)
Parametrization = Literal["mup", "standard"]
FAMILY_OBJECTIVE = {"pt": "mlm", "bert": "mlm", "ut": "mlm", "tauformer": "clm"}
"""The data objective each family trains with (`workers.models.objective_of`): masked or next tokens."""
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


def width_error(arch: Arch, base_width: int, width: int, where: str) -> str | None:
    """Why `width` cannot be built from `arch` tuned at `base_width` (None when it can; BERT and UT: any width;
    TauGPT: multiples of head_dim · kv_group).

    `PTConfig`'s rule: the size the paradigm widens (n_channels for 'channels', rank for 'rank')
    and, with topics, n_topics are given at base_width and must scale to an integer n·width/base_width.
    """
    if width < 1:
        return f"{where}={width} must be a positive integer"
    if isinstance(arch, TauArch):
        step = width_step(arch, base_width)
        return None if width % step == 0 else (
            f"{where}={width} is not a multiple of model.arch.head_dim · kv_group = {step} (TauGPT widens by "
            f"whole heads): use a multiple of {step}")
    if not isinstance(arch, PTArch):
        return None
    scaled = ("n_channels" if arch.paradigm == "channels" else "rank",)
    scaled += ("n_topics",) if arch.topic != "none" else ()
    for name in scaled:
        base = getattr(arch, name)
        if (base * width) % base_width:
            step = width_step(arch, base_width)
            return (f"{where}={width} is incompatible with tune.base_width={base_width}: model.arch.{name}="
                    f"{base} would scale to {base * width / base_width:g}, not an integer; use widths that "
                    f"are multiples of {step}, or change model.arch.{name}")
    return None


class _EncoderArch(BaseModel):
    """What BERT and UT share (`workers/models/bert.py`): heads of a fixed size, GELU FFN, LN placement."""

    model_config = _STRICT

    head_dim: PosInt = Field(32, description="fixed head size; heads = round(width / head_dim), ∝ width")
    ffn_mult: PosInt = Field(4, description="FFN width = ffn_mult · width")
    max_len: PosInt = Field(512, description="position rows; must be >= data.seq_len (set it equal: no unused rows)")
    norm: Literal["pre", "post"] = Field("pre", description="LayerNorm before each sublayer, or after (BERT)")


class BertArch(_EncoderArch):
    """BERT's fixed architecture (`BertConfig`'s fields but the derived ones and the hparams)."""

    n_layers: PosInt = Field(2, description="Transformer layers")
    tie_decoder: bool = Field(True, description="decoder weight = token embedding (BERT)")
    mlm_transform: bool = Field(True, description="BERT's dense + GELU + LN before the decoder")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on embeddings, attention and sublayers")
    zero_query: bool = Field(False, description="init option (mup's for μP): query projection at zero")
    zero_readout: bool = Field(False, description="init option (mup's for μP): an untied decoder at zero")


class UTArch(_EncoderArch):
    """The Universal Transformer's fixed architecture (`UTConfig`'s fields but the derived ones and hparams)."""

    n_steps: PosInt = Field(4, description="T, applications of the one shared layer (ACT's maximum)")
    timing: Literal["sinusoidal", "learned"] = Field(
        "sinusoidal", description="position and timestep signals: sinusoidal (UT paper) or learned tables")
    act: bool = Field(False, description="adaptive computation time (halting per position)")
    act_threshold: float = Field(0.99, gt=0.0, le=1.0, description="ACT halts past this cumulative probability")
    act_penalty: float = Field(0.01, ge=0.0, description="τ, the ponder cost's weight in the loss")
    tie_decoder: bool = Field(True, description="decoder weight = token embedding")
    mlm_transform: bool = Field(True, description="BERT's dense + GELU + LN before the decoder")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on embeddings, attention and sublayers")
    zero_query: bool = Field(False, description="init option (mup's for μP): query projection at zero")
    zero_readout: bool = Field(False, description="init option (mup's for μP): decoder and halting unit at zero")


class TauArch(BaseModel):
    """TauGPT's fixed architecture (`TauConfig`'s fields but the derived ones and the hparams init_std,
    output_mult and temperature). Width grows by heads at a fixed head_dim (Tauformer spec §7.1)."""

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


def nested(info: ValidationInfo) -> dict[str, Any]:
    """`model_validate`'s strict and context for a model validated inside a validator: the outer call's, so
    `StudySpec.model_validate_json(..., strict=True, context={"strict": True})` (the API) is strict throughout."""
    context = info.context if isinstance(info.context, dict) else {}
    return {"strict": True if context.get("strict") else None, "context": info.context}


ARCHS: dict[str, type[BaseModel]] = {"pt": PTArch, "bert": BertArch, "ut": UTArch, "tauformer": TauArch}
Arch = PTArch | BertArch | UTArch | TauArch


def width_step(arch: Arch, base_width: int) -> int:
    """Widths `arch` builds at are the multiples of this (PT: its scaled sizes must stay integers; TauGPT:
    whole kv groups of heads; else 1)."""
    if isinstance(arch, TauArch):
        return arch.head_dim * arch.kv_group
    if not isinstance(arch, PTArch):
        return 1
    scaled = ("n_channels" if arch.paradigm == "channels" else "rank",)
    scaled += ("n_topics",) if arch.topic != "none" else ()
    return math.lcm(*(base_width // math.gcd(getattr(arch, n), base_width) for n in scaled))


def rebase(arch: Arch, base_width: int, new_base: int) -> Arch:
    """`arch` with its sizes given at `new_base` instead of `base_width` (the same models at every width).

    PT's scaled sizes are given at the base width (h = n_channels · width / base_width); moving the μP base
    to `new_base` (a compatible width) rescales them. BERT and UT have no such sizes.
    """
    if not isinstance(arch, PTArch):
        return arch
    error = width_error(arch, base_width, new_base, "the new base width")
    if error:
        raise ValueError(error)
    scaled = ("n_channels" if arch.paradigm == "channels" else "rank",)
    scaled += ("n_topics",) if arch.topic != "none" else ()
    return arch.model_copy(update={n: getattr(arch, n) * new_base // base_width for n in scaled})


class ModelSpec(BaseModel):
    """The model family, its parametrization and its fixed architecture (the arch class follows `family`)."""

    model_config = _STRICT

    family: ModelFamily = Field("pt", description=f"the model family, one of {list(MODEL_FAMILIES)}")
    parametrization: Parametrization = Field("mup", description="'mup' (μP) or 'standard'")
    arch: Arch = Field(None, validate_default=True,  # type: ignore[assignment]  (None: the family's defaults)
                       description="the fixed architecture: PTArch, BertArch, UTArch or TauArch by family")

    @field_validator("arch", mode="wrap")
    @classmethod
    def _arch_of_family(cls, value: Any, handler: Any, info: ValidationInfo) -> Arch:
        arch_cls = ARCHS[info.data.get("family", "pt")]
        if value is None:
            return arch_cls()
        if isinstance(value, arch_cls):
            return value
        return arch_cls.model_validate(value.model_dump() if isinstance(value, BaseModel) else value,
                                       **nested(info))

    @model_validator(mode="after")
    def _mup_needs_uv(self) -> ModelSpec:
        arch = self.arch
        if isinstance(arch, PTArch) and self.parametrization == "mup" and arch.decomposition != "uv":
            raise ValueError(f"model.arch.decomposition={arch.decomposition!r}: μP is specified for "
                             "'uv' only (PT spec §3.1); use decomposition: uv or parametrization: standard")
        return self
