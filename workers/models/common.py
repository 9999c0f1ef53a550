"""What several model families share: the token loss, and the μP rules of BERT, UT and TauGPT.

`token_loss` is every family's loss: cross-entropy over the labelled positions, which are the masked tokens
(mlm: PT, BERT, UT) or the next tokens (clm: TauGPT).

`MuReadout` holds the μP rules (mup's, Tensor Programs V Table 8, Adam) of a model whose parameters fall in
the groups input / hidden / output / bias and whose logits are read out as output_mult · x Wᵀ: BERT and UT
(`workers/models/bert.py`'s `Encoder`) and TauGPT. PT's rules differ (its output lr scales too) and stay in
`workers/models/pt.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from studies.arch import BertConfig, TauConfig, UTConfig
from workers.batches import IGNORE_INDEX


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled positions (labels != -100): (…, V) logits, (…) labels."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def parameter(t: torch.Tensor) -> nn.Parameter:
    """`t`, a module's weight or bias, as the `nn.Parameter` it is (torch's stubs declare those `Tensor`)."""
    assert isinstance(t, nn.Parameter), f"expected an nn.Parameter, got {type(t).__name__}"
    return t


class MuReadout:
    """μP learning rates and readout scale for the input / hidden / output / bias grouping (mixed into
    `Encoder` and `TauGPT`)."""

    cfg: BertConfig | UTConfig | TauConfig

    def lr_multipliers(self) -> dict[str, float]:
        """Per-group factors on the base learning rate (μP: hidden ∝ 1/width_mult, as mup's MuAdamW)."""
        if self.cfg.parametrization != "mup":
            return {"input": 1.0, "hidden": 1.0, "output": 1.0, "bias": 1.0}
        # --- μP: Adam learning rates, hidden ∝ d0/d; input, output (read out × d0/d) and vectors unscaled ---
        return {"input": 1.0, "hidden": 1.0 / self.cfg.width_mult, "output": 1.0, "bias": 1.0}
        # --- end μP ---

    def readout_mult(self) -> float:
        """The logits' multiplier: output_mult, × d0/d under μP (mup's MuReadout / MuSharedReadout)."""
        cfg = self.cfg
        if cfg.parametrization == "mup":
            # --- μP: readout output_mult · d0/d ---
            return cfg.output_mult / cfg.width_mult
            # --- end μP ---
        return cfg.output_mult
