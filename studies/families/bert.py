"""BERT (`workers.models.bert`): its arch, its config, its parameter and FLOP counts and its registration (its
search space and the encoder's shared parts: `studies.families.encoder`)."""

from __future__ import annotations

from pydantic import Field

from studies.arch import PosInt
from studies.families.encoder import (
    COORD_HP,
    BaselineSpace,
    EncoderArch,
    EncoderConfig,
    encoder_flops,
    head_params,
    layer_params,
)
from studies.family import Family, register


class BertArch(EncoderArch):
    """BERT's fixed architecture."""

    n_layers: PosInt = Field(2, description="Transformer layers")


class BertConfig(BertArch, EncoderConfig):
    """Everything `workers.models.bert.Bert` is built from."""


def bert_params(arch: BertArch, width: int, vocab_size: int, base_width: int | None = None) -> int:
    d, V = width, vocab_size
    emb = V * d + arch.max_len * d + 2 * d  # tokens, positions, the embedding/final LayerNorm
    return emb + arch.n_layers * layer_params(d, arch) + head_params(d, V, arch)


def bert_flops(arch: BertArch, width: int, vocab_size: int, seq_len: int, n_decoded: float,
               base_width: int | None = None) -> dict[str, float]:
    return encoder_flops(arch, arch.n_layers, width, vocab_size, seq_len, n_decoded)


FAMILY = register(Family("bert", BertArch, BertConfig, BaselineSpace, "workers.models.bert:Bert",
                         coord_hp={"n_layers": 2, **COORD_HP}, param_count=bert_params, forward_flops=bert_flops,
                         batchable=BaselineSpace.HPARAMS))
