"""What several model families share: the token loss, and the μP rules of BERT, UT and TauGPT.

`token_loss` is every family's loss: cross-entropy over the labelled positions (masked tokens for mlm, next
tokens for clm).

`MuReadout` holds mup's μP rules (Tensor Programs V Table 8, Adam) for models whose parameters fall in the groups
input / hidden / output / bias and whose logits are output_mult · x Wᵀ: BERT, UT and TauGPT (PT's output lr scales
too; its rules stay in `workers/models/pt.py`). It holds CompleteP's depth rules too (Dey et al. 2025, arXiv
2505.01618, Table 1 and §3; α = 1), m_L = depth / base_depth: residual branches × m_L^-α, the blocks' groups `block` and
`block_bias` with Adam lr × m_L^(α-1) and ε × m_L^-α (a block's gradient carries its branch's m_L^-α, and ε must
shrink with it); embeddings, readout and every init unchanged. Blocks shared across depth take factor 1 at α = 1.
Rule by rule, and why: docs/mup.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from studies.families.bert import BertConfig
from studies.families.tauformer import TauConfig
from studies.families.ut import UTConfig
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
    `Encoder` and `TauGPT`), and the depth rules (module docstring) for the blocks' groups block / block_bias."""

    cfg: BertConfig | UTConfig | TauConfig
    shared_blocks: bool = False  # one block applied at every depth (UT): its gradient sums the L applications

    def lr_multipliers(self) -> dict[str, float]:
        """Per-group factors on the base learning rate (μP: hidden ∝ 1/width_mult, as mup's MuAdamW; a depth
        parametrization adds the blocks' groups)."""
        width = 1.0
        if self.cfg.parametrization == "mup":
            # --- μP: Adam learning rates, hidden ∝ d0/d; input, output (read out × d0/d) and vectors unscaled ---
            width = 1.0 / self.cfg.width_mult
            # --- end μP ---
        mult = {"input": 1.0, "hidden": width, "output": 1.0, "bias": 1.0}
        if self.cfg.depth_parametrization != "none":
            # --- depth (CompleteP, Table 1): the blocks' Adam lr × m_L^(α-1), on top of μP's width rule ---
            depth = self.cfg.depth_mult ** (self.cfg.depth_alpha - 1.0)
            mult |= {"block": width * depth, "block_bias": depth}
            # --- end depth ---
        return mult

    def eps_multipliers(self) -> dict[str, float]:
        """Per-group factors on Adam's ε (module docstring): the blocks' m_L^-α (shared blocks: m_L^(1-α))."""
        if self.cfg.depth_parametrization == "none":
            return {}
        # --- depth (CompleteP, Table 1): the blocks' Adam ε × m_L^-α (with width only under train.adam_eps_scaling) ---
        alpha = self.cfg.depth_alpha
        eps = self.cfg.depth_mult ** ((1.0 - alpha) if self.shared_blocks else -alpha)
        return {"block": eps, "block_bias": eps}
        # --- end depth ---

    def branch_mult(self) -> float:
        """Each residual branch's multiplier: m_L^-α (CompleteP, Table 1; 1 at `none`)."""
        # --- depth (CompleteP §3, Table 1: x_{l+1} = x_l + m_L^-α · F_l(x_l)) ---
        return float(self.cfg.depth_mult ** -self.cfg.depth_alpha)
        # --- end depth ---

    def depth_groups(self, groups: dict[str, list[nn.Parameter]], blocks: nn.Module) -> dict[str, list[nn.Parameter]]:
        """`groups` with the residual blocks' matrices moved from hidden to "block" and their vectors from bias to
        "block_bias" under a depth parametrization (`groups` itself at `none`: the groups every existing run has)."""
        if self.cfg.depth_parametrization == "none":
            return groups
        inside = {id(p) for p in blocks.parameters()}
        out = {name: [p for p in params if id(p) not in inside] for name, params in groups.items()}
        out["block"] = [p for p in groups["hidden"] if id(p) in inside]
        out["block_bias"] = [p for p in groups["bias"] if id(p) in inside]
        missing = inside - {id(p) for p in out["block"] + out["block_bias"]}
        assert not missing, "a block parameter outside the hidden and bias groups"
        return out

    def readout_mult(self) -> float:
        """The logits' multiplier: output_mult, × d0/d under μP (mup's MuReadout / MuSharedReadout)."""
        cfg = self.cfg
        if cfg.parametrization == "mup":
            # --- μP: readout output_mult · d0/d ---
            return cfg.output_mult / cfg.width_mult
            # --- end μP ---
        return cfg.output_mult
