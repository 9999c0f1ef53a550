"""Hugging Face causal LMs (`workers.models.hf`): a `transformers` architecture named by its `model_type`, built
from its config in code (no weights, no tokenizer, nothing downloaded), with μP by ptctl's own rules.

A spec names the architecture and may carry the rest of the user's config (`HFArch.config`: a mapping, or on the
command line a path to a config.json). The width keys are ptctl's: at each width `HFConfig.hf_kwargs` sets the
hidden size, the heads (and kv heads, and head_dim where the architecture has the key), the FFN width
(`ffn_ratio` · width), the depth (`n_layers`) and the vocabulary from the declared `RULES` of its model_type;
every other key passes through as given. ptctl's defaults over HF's: no dropout (every family's default, and what
a batched member needs to equal its solo trial) and no special token ids (the data's vocabulary has its own).

Counts: `hf_params` and `hf_flops` from the same keys (`tests/studies/test_hf_counts.py` checks them against the
built model). Rule by rule, μP: docs/mup.md ("Hugging Face models").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from studies.arch import Arch, ModelSize, PosInt
from studies.family import Family, register
from studies.space import Range, Searched, searched_range, space_model

ModelType = Literal["gpt2", "llama", "qwen2", "gpt_neox"]


@dataclass(frozen=True)
class Rules:
    """Where one architecture keeps what ptctl sets per width, and the HF defaults its counts read."""

    width: str  # the model width d
    heads: str  # query heads
    ffn: str  # the FFN's inner width
    layers: str  # decoder layers
    context: str  # the longest sequence (learned positions, or RoPE's nominal length)
    context_default: int  # HF's default for `context`
    kv_heads: str | None = None  # key/value heads (grouped-query attention), where the architecture has them
    head_dim: str | None = None  # the config key of the head size, where it is not d / heads
    gated: bool = False  # a gated FFN (SwiGLU: gate, up and down matrices) rather than two
    learned_positions: bool = False  # a `context` × d position table (GPT-2's wpe)
    norm_bias: bool = True  # LayerNorm (weight and bias) rather than RMSNorm (weight)
    qkv_bias: tuple[str, bool] | bool = True  # the q/k/v projections' bias: always, never, or (config key, default)
    out_bias: tuple[str, bool] | bool = True  # the attention output's bias
    ffn_bias: tuple[str, bool] | bool = True  # the FFN matrices' biases
    tie_default: bool = False  # HF's tie_word_embeddings default
    defaults: tuple[tuple[str, Any], ...] = ()  # ptctl's defaults over HF's (module docstring)


RESERVED = frozenset({"attn_implementation", "dtype", "torch_dtype"})  # config keys ptctl sets (and any "_..." key)
_NO_IDS = (("bos_token_id", None), ("eos_token_id", None), ("pad_token_id", None))
RULES: dict[str, Rules] = {
    "gpt2": Rules("n_embd", "n_head", "n_inner", "n_layer", "n_positions", 1024, learned_positions=True,
                  tie_default=True, defaults=(("resid_pdrop", 0.0), ("embd_pdrop", 0.0), ("attn_pdrop", 0.0),
                                              *_NO_IDS)),
    "llama": Rules("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                   "max_position_embeddings", 2048, kv_heads="num_key_value_heads", head_dim="head_dim", gated=True,
                   norm_bias=False, qkv_bias=("attention_bias", False), out_bias=("attention_bias", False),
                   ffn_bias=("mlp_bias", False), defaults=(("attention_dropout", 0.0), *_NO_IDS)),
    "qwen2": Rules("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                   "max_position_embeddings", 32768, kv_heads="num_key_value_heads", head_dim="head_dim", gated=True,
                   norm_bias=False, qkv_bias=True, out_bias=False, ffn_bias=False,
                   defaults=(("attention_dropout", 0.0), *_NO_IDS)),
    "gpt_neox": Rules("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                      "max_position_embeddings", 2048, qkv_bias=("attention_bias", True),
                      out_bias=("attention_bias", True),
                      defaults=(("attention_dropout", 0.0), ("hidden_dropout", 0.0), *_NO_IDS)),
}
"""The supported architectures (a literal registry: a new one is a line here, its counts' test and its docs)."""


class HFArch(Arch):
    """What a study fixes of a Hugging Face model: its architecture, its config, and how width is spread over heads
    and the FFN."""

    finer_steps: ClassVar[str] = "lower model.arch.head_dim (or n_heads) or kv_group"
    model_type: ModelType = Field("llama", description="the architecture, by transformers' own word (its "
                                  "config's model_type)")
    config: dict[str, Any] = Field(default_factory=dict, description="the rest of the model's config, passed "
                                   "through (on the command line also a path to a config.json); the width keys, "
                                   "the depth key and vocab_size are set by ptctl and replaced if given")
    n_layers: PosInt = Field(2, description="decoder layers (the config's depth key)")
    head_dim: PosInt | None = Field(16, description="fixed head size: heads = width / head_dim, ∝ width "
                                    "(null: a fixed number of heads, n_heads)")
    n_heads: PosInt | None = Field(None, description="fixed number of heads, their size width / n_heads (give "
                                   "head_dim: null with it)")
    kv_group: PosInt = Field(1, description="query heads per key/value head (grouped-query attention; 1: none)")
    ffn_ratio: float = Field(4.0, gt=0, le=64, description="FFN width = round(ffn_ratio · width) (Llama's own "
                             "sizes: ≈ 2.69)")
    zero_readout: bool = Field(False, description="μP init option: the readout (an untied lm_head) at zero")

    @field_validator("config", mode="before")
    @classmethod
    def _read_config(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        if isinstance(info.context, dict) and info.context.get("strict"):
            raise ValueError("model.arch.config is a path, which the API does not read on its host: give the "
                             "config's fields as a mapping (ptctl study submit reads the file for you)")
        path = Path(value).expanduser()
        try:
            loaded = json.loads(path.read_text())
        except OSError as err:
            raise ValueError(f"model.arch.config: cannot read {value!r} ({err.strerror}): give the path of a "
                             "config.json, or the config's fields as a mapping") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"model.arch.config: {value!r} is not JSON ({err.msg} at line {err.lineno}): give "
                             "a config.json") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"model.arch.config: {value!r} holds a JSON {type(loaded).__name__}, not an object")
        return loaded

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        given = self.config.get("model_type")
        if given is not None and given != self.model_type:
            raise ValueError(f"model.arch.config has model_type {given!r} but model.arch.model_type is "
                             f"{self.model_type!r}: set model.arch.model_type: {given}")
        reserved = sorted(k for k in self.config if k in RESERVED or k.startswith("_"))
        if reserved:
            raise ValueError(f"model.arch.config.{reserved[0]} is ptctl's to set (the attention runs through its "
                             "μP scale, the dtype is the trial's): remove it from model.arch.config")
        if (self.head_dim is None) == (self.n_heads is None):
            raise ValueError("model.arch.head_dim and model.arch.n_heads: give exactly one (a fixed head size, "
                             "heads ∝ width; or a fixed number of heads, head size ∝ width), the other null")
        if self.kv_group > 1 and RULES[self.model_type].kv_heads is None:
            raise ValueError(f"model.arch.kv_group={self.kv_group}: {self.model_type} has no grouped-query "
                             "attention; set kv_group: 1")
        return self

    @property
    def rules(self) -> Rules:
        return RULES[self.model_type]

    def context(self) -> tuple[str, int] | None:
        value = self.config.get(self.rules.context, self.rules.context_default)
        return (f"config.{self.rules.context}", value) if isinstance(value, int) else None

    def width_steps(self, base_width: int) -> dict[str, int]:
        if self.n_heads is not None:
            return {"n_heads": self.n_heads * self.kv_group}
        assert self.head_dim is not None  # exactly one of the two (`_consistent`)
        return {"head_dim": self.head_dim * self.kv_group}

    def heads_at(self, width: int) -> tuple[int, int, int]:
        """(query heads, kv heads, head size) at `width`."""
        heads = self.n_heads if self.n_heads is not None else width // (self.head_dim or width)
        return heads, heads // self.kv_group, width // heads

    def ffn_at(self, width: int) -> int:
        return max(1, round(self.ffn_ratio * width))

    def flag(self, which: tuple[str, bool] | bool) -> bool:
        """A bias flag of `Rules`: fixed, or the config's key (HF's default when absent)."""
        return which if isinstance(which, bool) else bool(self.config.get(which[0], which[1]))

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", self.rules.tie_default))


class HFHparams(BaseModel):
    """The hparams but lr. Each field's default, description and search bounds (`Searched`) are `HFSpace`'s too."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    init_std: Annotated[float, Searched(0.002, 0.2)] = Field(
        0.02, gt=0, description="HF's initializer_range: the std of every matrix as HF draws it (μP: the hidden "
        "matrices' × √(base_width/width))")
    output_mult: Annotated[float, Searched(0.1, 10.0)] = Field(
        1.0, gt=0, description="multiplier of the logits (μP: output_mult · base_width/width)")
    attn_mult: Annotated[float, Searched(0.25, 4.0)] = Field(
        1.0, gt=0, description="multiplier of the attention logits (μP: q·k/head_dim; standard: q·k/√head_dim)")


class HFConfig(HFArch, ModelSize, HFHparams):
    """Everything `workers.models.hf.HFModel` is built from."""

    def hf_kwargs(self) -> dict[str, Any]:
        """The transformers config's keys at this width (module docstring)."""
        r = self.rules
        heads, kv_heads, head_dim = self.heads_at(self.width)
        sizes: dict[str, Any] = {r.width: self.width, r.heads: heads, r.ffn: self.ffn_at(self.width),
                                 r.layers: self.n_layers, "vocab_size": self.vocab_size}
        if r.kv_heads is not None:
            sizes[r.kv_heads] = kv_heads
        if r.head_dim is not None:
            sizes[r.head_dim] = head_dim
        return {**dict(r.defaults), **self.config, **sizes}


HFSpace = space_model(
    "HFSpace", "The Hugging Face space (`workers/models/hf.py`): lr (3e-3: Adam, small decoders), then `HFHparams`' "
    "ranges.",
    {"lr": Field(default_factory=lambda: Range(low=1e-4, high=3e-2, log=True, default=3e-3),
                 description="base learning rate of AdamW (μP scales the hidden group's by base_width/width)"),
     **{name: searched_range(field) for name, field in HFHparams.model_fields.items()}},
    Field(default_factory=list, description="hparams held at their default, e.g. [attn_mult]"), __name__)


# ----------------------------------------------------------------------------- counts (`studies.budget`)
def hf_params(arch: HFArch, width: int, vocab_size: int, base_width: int | None = None) -> int:
    """The parameters of the built model (tied embeddings counted once)."""
    r, d, V = arch.rules, width, vocab_size
    heads, kv_heads, hd = arch.heads_at(d)
    q, kv, f = heads * hd, kv_heads * hd, arch.ffn_at(d)
    norm = 2 * d if r.norm_bias else d
    attn = d * (q + 2 * kv) + q * d + (q + 2 * kv) * arch.flag(r.qkv_bias) + d * arch.flag(r.out_bias)
    ffn = (3 if r.gated else 2) * d * f + ((2 if r.gated else 1) * f + d) * arch.flag(r.ffn_bias)
    context = arch.context()
    positions = context[1] * d if r.learned_positions and context else 0
    return V * d + positions + arch.n_layers * (attn + ffn + 2 * norm) + norm + (0 if arch.tied else V * d)


def hf_flops(arch: HFArch, width: int, vocab_size: int, seq_len: int, n_decoded: float,
             base_width: int | None = None) -> dict[str, float]:
    """Matmul FLOPs of the forward (docs/studies.md, FLOP counts): every layer's, and the readout's."""
    d, n, L = width, seq_len, arch.n_layers
    heads, kv_heads, hd = arch.heads_at(d)
    f = arch.ffn_at(d)
    return {"qkv": L * 2 * n * d * (heads + 2 * kv_heads) * hd, "attention": L * 2 * 2 * n * n * heads * hd,
            "out": L * 2 * n * heads * hd * d, "ffn": L * (3 if arch.rules.gated else 2) * 2 * n * d * f,
            "decoder": 2 * n_decoded * d * vocab_size}


# The coordinate check's model: a 2-layer Llama with heads of 16 at widths from 32, init_std 0.05. HF's 0.02 is set
# for widths near 768; at the check's widths it leaves the random part so small that μP's attention logits shrink
# with width over the first updates (to −0.30 at step 3), as BERT's do (`studies/families/encoder.py: COORD_HP`).
# At 0.1 the random part hides, over the check's 3 steps, the growth of a 1/√head_dim scale kept under μP (it
# passes); 0.05 sees both right (docs/LOG.md).
COORD_HP = {"model_type": "llama", "n_layers": 2, "head_dim": 16, "init_std": 0.05,
            "config": {"max_position_embeddings": 64}}
FAMILY = register(Family("hf", HFArch, HFConfig, HFSpace, "workers.models.hf:HFModel", objective="clm",
                         readout="logits", coord_hp=COORD_HP, param_count=hf_params, forward_flops=hf_flops,
                         batchable=HFSpace.HPARAMS))
