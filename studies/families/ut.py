"""The Universal Transformer (`workers.models.universal`): its arch, its config, its parameter and FLOP counts and
its registration (its search space and the encoder's shared parts: `studies.families.encoder`)."""

from __future__ import annotations

from typing import ClassVar, Literal

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


class UTArch(EncoderArch):
    """The Universal Transformer's fixed architecture. Its depth L is `n_steps`, the applications of its one
    shared block: the depth parametrization (`DepthArch`) scales each application's branch by base_depth/n_steps
    (`workers/models/universal.py` says why L is the steps, not the one block)."""

    depth_field: ClassVar[str] = "n_steps"

    n_steps: PosInt = Field(4, description="T, applications of the one shared layer (ACT's maximum)")
    timing: Literal["sinusoidal", "learned"] = Field(
        "sinusoidal", description="position and timestep signals: sinusoidal (UT paper) or learned tables")
    act: bool = Field(False, description="adaptive computation time (halting per position)")
    act_threshold: float = Field(0.99, gt=0.0, le=1.0, description="ACT halts past this cumulative probability")
    act_penalty: float = Field(0.01, ge=0.0, description="τ, the ponder cost's weight in the loss")


class UTConfig(UTArch, EncoderConfig):
    """Everything `workers.models.universal.UniversalTransformer` is built from."""


def ut_params(arch: UTArch, width: int, vocab_size: int, base_width: int | None = None) -> int:
    d, V = width, vocab_size
    emb = V * d + 2 * d + ((arch.max_len + arch.n_steps) * d if arch.timing == "learned" else 0)
    halt = d + 1 if arch.act else 0
    return emb + layer_params(d, arch) + halt + head_params(d, V, arch)


def ut_flops(arch: UTArch, width: int, vocab_size: int, seq_len: int, n_decoded: float,
             base_width: int | None = None) -> dict[str, float]:
    """The shared layer × T (ACT: × T, its maximum, plus the halting unit per step)."""
    halting = {"halting": float(arch.n_steps * 2 * seq_len * width)} if arch.act else {}
    return encoder_flops(arch, arch.n_steps, width, vocab_size, seq_len, n_decoded, halting)


FAMILY = register(Family("ut", UTArch, UTConfig, BaselineSpace, "workers.models.universal:UniversalTransformer",
                         coord_hp={"n_steps": 3, **COORD_HP}, param_count=ut_params, forward_flops=ut_flops,
                         batchable=BaselineSpace.HPARAMS))
