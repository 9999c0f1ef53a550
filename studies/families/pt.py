"""The Probabilistic Transformer (`workers.models.pt`): its arch, its hparams, its config, its search space, its
parameter and FLOP counts and its registration.

PT's hparams are declared once, as every built-in family's, in `PTWeights` (the six information weights, PT spec
§3.2: the default, the description and the search range of each) and `LR`: `HPARAMS`, `INFORMATION_WEIGHTS` and the
search space (`SearchSpace`) are derived from them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from studies.arch import ANY_LENGTH, Arch, ModelSize, NonNegInt, PosInt, width_error
from studies.family import Family, register
from studies.space import Range, Searched, searched_range, space_model


class PTArch(Arch):
    """PT's fixed architecture: `PTConfig`'s fields except `vocab_size` (from `data`), `width`,
    `base_width` (from the phase and `tune`), `parametrization` (from `model`) and the six
    information weights (hparams, from `space`). Sizes are given at `tune.base_width`."""

    context_field = ANY_LENGTH  # no positions: a head's distance to its dependent is clipped to γ buckets
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

    finer_steps = " (PT: paradigm 'rank' with rank a multiple of base_width/2 steps by 2)"

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

    def rebased(self, base_width: int, new_base: int) -> PTArch:
        """The scaled sizes given at `new_base` (a compatible width) instead of `base_width`."""
        error = width_error(self, base_width, new_base, "the new base width")
        if error:
            raise ValueError(error)
        return self.model_copy(update=self.at_width(new_base, base_width))

    def mup_error(self, parametrization: str) -> str | None:
        if parametrization == "mup" and self.decomposition != "uv":
            return (f"model.arch.decomposition={self.decomposition!r}: μP is specified for 'uv' only (PT spec §3.1); "
                    "use decomposition: uv or parametrization: standard")
        return None


Weight = Annotated[float, Searched(0.25, 4.0)]
"""An information weight: 1 in the original PT, searched in [1/4, 4]."""


class PTWeights(BaseModel):
    """PT's hparams but lr: the six information weights (PT spec §3.2), all 1 in the original PT. Each field's
    default, description and search bounds (`Searched`) are the search space's too."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    w_H: Weight = Field(1.0, description="the ternary → H message (the attention logits)")
    w_topic: Weight = Field(1.0, description="the binary → topic message (the topic logits)")
    w_unary: Weight = Field(1.0, description="the unary → Z message S")
    w_dep: Weight = Field(1.0, description="the ternary → Z message with the word as dependent (G_dep)")
    w_head: Weight = Field(1.0, description="the ternary → Z message with the word as head (G_head)")
    w_topic_z: Weight = Field(1.0, description="the binary → Z message (from the topic variables)")


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


# ----------------------------------------------------------------------------- the hparams and their space
LR = Field(default_factory=lambda: Range(low=1e-4, high=1e-1, log=True, default=1e-2),
           description="base learning rate of AdamW (μP scales it per parameter group)")


INFORMATION_WEIGHTS: tuple[str, ...] = tuple(PTWeights.model_fields)
"""PT's six message scalings (PT spec §3.2): every hparam but `lr`."""

HPARAMS: tuple[str, ...] = ("lr", *INFORMATION_WEIGHTS)
"""PT's seven transferred hparams."""

SearchSpace = space_model(
    "SearchSpace", "PT's space: a `Range` per hparam (each optional: omitted ones take the documented default "
    "range).", {"lr": LR, **{n: searched_range(f, f"{n}: the scale of {f.description} (PT spec §3.2)")
                 for n, f in PTWeights.model_fields.items()}},
    Field(default_factory=list, description="hparams held at their default instead of searched, e.g. "
          "[w_topic, w_topic_z] when model.arch.topic is 'none' (those weights then have no effect)"),
    __name__)


# ----------------------------------------------------------------------------- counts (`studies.budget`)
def _sizes(arch: PTArch, width: int, base_width: int) -> tuple[int, int, int, int]:
    """PT's (K, h, r, m) at `width` (sizes given at `base_width`, widened by the paradigm; m = 0 without topics)."""
    error = width_error(arch, base_width, width, "width")
    if error:
        raise ValueError(error)
    sizes = arch.at_width(width, base_width)
    k = 2 * arch.gamma + 2  # γ = 0: one bucket per direction (the authors' dists = "")
    m = sizes["n_topics"] if arch.topic != "none" else 0
    return k, sizes.get("n_channels", arch.n_channels), sizes.get("rank", arch.rank), m


def pt_params(arch: PTArch, width: int, vocab_size: int, base_width: int | None) -> int:
    """PT: S, decoder (+ bias), the ternary factors, topics."""
    if base_width is None:
        raise ValueError("PT's arch sizes are given at the base width: pass base_width=")
    d, V = width, vocab_size
    k, h, r, m = _sizes(arch, d, base_width)
    factors = {"uv": 2 * k * h * d * r, "uvw": 2 * k * d * r + k * h * r, "none": k * h * d * d}
    return 2 * V * d + V + factors[arch.decomposition] + m * d


def pt_flops(arch: PTArch, width: int, vocab_size: int, seq_len: int, n_decoded: float,
             base_width: int | None) -> dict[str, float]:
    """PT's matmul FLOPs of one forward pass (the terms: docs/studies.md, "Parameter and FLOP counts")."""
    if base_width is None:
        raise ValueError("PT's arch sizes are given at the base width: pass base_width=")
    d, V, n = width, vocab_size, seq_len
    k, h, r, m = _sizes(arch, d, base_width)
    r = d if arch.decomposition == "none" else r  # the full T is used as U = T, V = I
    n_far = 2
    n_msg = 1 if arch.block_msg else 2
    p_near = sum(2 * (n - off) for off in range(1, min(arch.gamma, n - 1) + 1))
    per_iter = {"projections": 2 * 2 * n * d * k * h * r, "far_scores": n_far * 2 * h * n * n * r,
                "gathers": n_msg * n_far * 2 * h * n * n * r, "back_projections": n_msg * 2 * n * k * h * r * d,
                "topics": 2 * 2 * n * d * m, "near": (1 + n_msg) * 2 * h * p_near * r}
    terms: dict[str, float] = {name: arch.n_iter * v for name, v in per_iter.items()}
    terms["decoder"] = 2 * n_decoded * d * V
    return terms


def _may_vanish(hp: dict[str, Any]) -> tuple[str, ...]:
    """With r ∝ width the random initial part of PT's 1/r head logits vanishes as r^-1/2 (μP allows it)."""
    return ("head_logits",) if hp.get("paradigm") == "rank" else ()


FAMILY = register(Family(
    "pt", PTArch, PTConfig, SearchSpace, "workers.models.pt:ProbabilisticTransformer",
    coord_hp={"n_channels": 2, "rank": 8, "n_iter": 3, "gamma": 3},
    coord_may_vanish=_may_vanish, param_count=pt_params, forward_flops=pt_flops, width_multiples=True,
    batchable=SearchSpace.HPARAMS, paradigms=get_args(PTArch.model_fields["paradigm"].annotation)))
