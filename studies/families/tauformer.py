"""TauGPT, the Tauformer (`workers.models.tauformer`): its arch, its config, its search space and its
registration. A causal LM (objective "clm"): it cannot join a compare study, and has no parameter counts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from studies.arch import DepthArch, ModelSize, NonNegInt, PosInt
from studies.family import Family, register
from studies.space import Range, Searched, searched_range, space_model


class TauArch(DepthArch):
    """TauGPT's fixed architecture. Width grows by heads at a fixed head_dim (Tauformer spec §7.1); the depth
    parametrization (`DepthArch`) scales its blocks with n_layers."""

    context_field = "max_len"  # data.seq_len must not exceed it
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

    def width_advice(self, where: str, width: int, base_width: int, name: str, step: int) -> str:
        return (f"{where}={width} is not a multiple of model.arch.head_dim · kv_group = {step} (TauGPT widens "
                f"by whole heads): use a multiple of {step}")


class TauHparams(BaseModel):
    """TauGPT's hparams but lr. Each field's default, description and search bounds (`Searched`) are `TauSpace`'s
    too."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    init_std: Annotated[float, Searched(0.1, 2.0)] = Field(
        0.5, gt=0, description="matrices: std = init_std / √fan_in (the reference's Kaiming gain 0.5)")
    output_mult: Annotated[float, Searched(0.1, 10.0)] = Field(
        1.0, gt=0, description="multiplier of the LM logits (μP: output_mult · base_width/width)")
    temperature: Annotated[float, Searched(0.005, 0.5)] = Field(
        0.03, gt=0, description="initial per-head temperature T_h of the λ logits −|λq − λk|/T (learned from there "
        "by default; Tauformer spec §3.2: ≈ the λ spread at init at D = 64)")


class TauConfig(TauArch, ModelSize, TauHparams):
    """Everything `workers.models.tauformer.TauGPT` is built from, and its heads."""

    @property
    def n_heads(self) -> int:
        return self.width // self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads // self.kv_group


TauSpace = space_model(
    "TauSpace", "The TauGPT space (`workers/models/tauformer.py`): lr (3e-3: Adam, small GPTs; the 30M post used "
    "5e-4 at width 384), then `TauHparams`' ranges.",
    {"lr": Field(default_factory=lambda: Range(low=1e-4, high=3e-2, log=True, default=3e-3),
                 description="base learning rate of AdamW (μP scales the hidden group's by base_width/width)"),
     **{name: searched_range(field) for name, field in TauHparams.model_fields.items()}},
    Field(default_factory=list, description="hparams held at their default, e.g. [temperature]"), __name__)

TAU_HPARAMS: tuple[str, ...] = TauSpace.HPARAMS
"""The TauGPT hparams: `lr`, the init std, the readout multiplier and the initial attention temperature."""


# TauGPT widens by heads at a fixed head_dim (the Laplacian's size): 2 heads at width 32, 16 at 256
FAMILY = register(Family("tauformer", TauArch, TauConfig, TauSpace, "workers.models.tauformer:TauGPT",
                         objective="clm", readout="lm_logits",
                         coord_hp={"n_layers": 2, "head_dim": 16, "max_len": 32},
                         flag_tags={"tau.collapse.": "taumode_collapse"},  # `analysis.taumode.collapse_warning`'s
                         batchable=TauSpace.HPARAMS))
