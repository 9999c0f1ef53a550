"""What BERT and the Universal Transformer share (`workers/models/bert.py`): the encoder's arch and config bases,
their search space (`BaselineSpace`: lr and mup's usual knobs) and the encoder's parameter and FLOP counts.
`bert` and `ut` register the families."""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from studies.arch import DepthArch, ModelSize, PosInt
from studies.space import Range, Searched, searched_range, space_model


class EncoderArch(DepthArch):
    """What BERT and UT share (`workers/models/bert.py`): heads of a fixed size, GELU FFN, LN placement, the
    MLM head and mup's init options, and the depth parametrization (`DepthArch`). Any width builds (heads =
    round(width / head_dim))."""

    context_field = "max_len"  # data.seq_len must not exceed it
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

    def heads_at(self, width: int) -> int:
        """Heads at `width`: the nearest whole number of `head_dim`-sized heads, at least one."""
        return max(1, (width + self.head_dim // 2) // self.head_dim)


class _EncoderHeads(Protocol):
    """What `EncoderConfig.n_heads` needs of a config: its width and its arch's `heads_at`."""

    @property
    def width(self) -> int: ...

    def heads_at(self, width: int) -> int: ...


class EncoderHparams(BaseModel):
    """BERT's and UT's hparams but lr (mup's usual knobs). Each field's default, description and search bounds
    (`Searched`) are `BaselineSpace`'s too. init_std 0.05: BERT's 0.02 is ≈ 0.55/√768; at the widths of a CPU
    study, ~100, the same fan-in-relative std is ≈ 0.05."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    init_std: Annotated[float, Searched(0.005, 0.5)] = Field(
        0.05, gt=0, description="std of the embeddings and readout, and of the hidden weights at base_width "
        "(standard: at every width; μP: ∝ 1/√width above)")
    output_mult: Annotated[float, Searched(0.1, 10.0)] = Field(
        1.0, gt=0, description="multiplier of the MLM logits (μP: output_mult · base_width/width)")
    attn_mult: Annotated[float, Searched(0.25, 4.0)] = Field(
        1.0, gt=0, description="multiplier of the attention logits (μP: q·k/head_dim; standard: q·k/√head_dim)")


class EncoderConfig(ModelSize, EncoderHparams):
    """BERT's and UT's hparams and heads (the arch's `heads_at`, mixed in beside it)."""

    @property
    def n_heads(self: _EncoderHeads) -> int:
        return self.heads_at(self.width)


BaselineSpace = space_model(
    "BaselineSpace", "The BERT / UT space (`workers/models/bert.py`): lr (3e-3: Adam, small encoders), then "
    "`EncoderHparams`' ranges.",
    {"lr": Field(default_factory=lambda: Range(low=1e-4, high=1e-1, log=True, default=3e-3),
                 description="base learning rate of AdamW (μP scales the hidden group's by base_width/width)"),
     **{name: searched_range(field) for name, field in EncoderHparams.model_fields.items()}},
    Field(default_factory=list, description="hparams held at their default, e.g. [attn_mult]"), __name__)

BASELINE_HPARAMS: tuple[str, ...] = BaselineSpace.HPARAMS
"""The BERT and UT hparams: `lr` and the three multipliers of `workers/models/bert.py`."""


# ----------------------------------------------------------------------------- counts (`studies.budget`)
def layer_params(d: int, arch: EncoderArch) -> int:
    """One encoder layer's parameters at width `d`."""
    a, f = arch.heads_at(d) * arch.head_dim, arch.ffn_mult * d
    return 3 * (d * a + a) + a * d + d + d * f + f + f * d + d + 4 * d  # q k v, o, FFN, two LayerNorms


def head_params(d: int, vocab: int, arch: EncoderArch) -> int:
    """The MLM head's parameters (a tied decoder counted with the embedding)."""
    transform = d * d + d + 2 * d if arch.mlm_transform else 0
    return transform + (0 if arch.tie_decoder else vocab * d) + vocab  # decoder bias always


def encoder_flops(arch: EncoderArch, times: int, width: int, vocab_size: int, seq_len: int, n_decoded: float,
                  extra: dict[str, float] | None = None) -> dict[str, float]:
    """Matmul FLOPs of `times` layer applications, `extra` terms and the MLM head (docs/studies.md, FLOP counts)."""
    d, V, n = width, vocab_size, seq_len
    a, f = arch.heads_at(d) * arch.head_dim, arch.ffn_mult * d
    layer = {"qkv": 2 * n * d * 3 * a, "attention": 2 * 2 * n * n * a, "out": 2 * n * a * d, "ffn": 2 * 2 * n * d * f}
    terms: dict[str, float] = {name: times * v for name, v in layer.items()}
    terms.update(extra or {})
    terms["transform"] = 2 * n_decoded * d * d if arch.mlm_transform else 0
    terms["decoder"] = 2 * n_decoded * d * V
    return terms


# BERT and UT's coordinate check: heads of 16 dims, positions for the check's 32-token sequences, init_std 0.15
# at the base width 32 (≈ 0.85/√32, the order of BERT's 0.02 ≈ 0.55/√768 relative to fan-in; with 0.02 the random
# part is so small at d0 = 32 that the first updates' attention logits shrink with width: slopes to −0.6 under μP)
COORD_HP = {"head_dim": 16, "max_len": 32, "init_std": 0.15}
