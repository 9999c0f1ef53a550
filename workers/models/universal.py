"""Universal Transformer encoder (Dehghani et al. 2019) for MLM, standard and μP.

One Transformer layer (BERT's `Layer`) is applied `n_steps` times with shared parameters, the position and
timestep signals (sinusoidal as in the paper, or learned) added before every application. Adaptive computation
time (ACT, Graves 2016, as in the paper's tensor2tensor code) is an option: a halting unit per position, the
output a halting-weighted mix of the states, and a ponder cost `act_penalty · mean(N + R)` from `aux_loss()`.

μP is BERT's (`workers/models/bert.py`); the timestep table is an input weight, the halting unit an output.
CompleteP counts applications: L = `n_steps` (under ACT its maximum), and each step's branch and signals are
× m_L^-α, since T applications add T increments to the stream as T blocks would (docs/mup.md, "Depth").
Shapes: B batch, n length, d width, T steps, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from studies.families.ut import UTConfig
from workers.models.bert import Encoder, Layer, MLMHead


def sinusoid(length: int, d: int) -> torch.Tensor:
    """(length, d) sin/cos signal of Vaswani et al. (the UT paper's position and timestep signals)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)
    out = torch.zeros(length, d)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return out


class UniversalTransformer(Encoder):
    """UT encoder + MLM head. `forward(input_ids, attention_mask)` returns (B, n, V) logits."""

    cfg: UTConfig
    shared_blocks = True  # one block applied n_steps times (the depth rules' shared-block factors)
    pos_signal: torch.Tensor  # buffers (sinusoidal timing): (max_len, d), (T, d)
    step_signal: torch.Tensor

    def __init__(self, cfg: UTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, V = cfg.width, cfg.vocab_size
        self.tok_emb = nn.Embedding(V, d)  # (V, d)
        if cfg.timing == "learned":
            self.pos_emb = nn.Embedding(cfg.max_len, d)  # (max_len, d)
            self.step_emb = nn.Embedding(cfg.n_steps, d)  # (T, d)
        else:
            self.register_buffer("pos_signal", sinusoid(cfg.max_len, d), persistent=False)
            self.register_buffer("step_signal", sinusoid(cfg.n_steps, d), persistent=False)
        self.emb_ln = nn.LayerNorm(d)  # post-LN: after the embeddings; pre-LN: the final LN
        self.layer = Layer(d, cfg.n_heads, cfg.head_dim, cfg.ffn_mult * d, cfg.norm, cfg.dropout,
                           self.branch_mult())  # shared; the branch × (base_depth/n_steps)^α under completep
        self.halt = nn.Linear(d, 1) if cfg.act else None  # ACT's halting unit
        self.head = MLMHead(d, V, cfg.mlm_transform, self.tok_emb if cfg.tie_decoder else None)
        self.drop = nn.Dropout(cfg.dropout)
        self._ponder: torch.Tensor | None = None
        self._group()
        self._init()
        if self.halt is not None:
            with torch.no_grad():
                self.halt.bias.fill_(1.0)  # tensor2tensor: start by halting after a few steps

    def blocks(self) -> nn.Module:
        return self.layer

    def signals(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Position (n, d) and timestep (T, d) signals."""
        if self.cfg.timing == "learned":
            return self.pos_emb.weight[:n], self.step_emb.weight
        return self.pos_signal[:n], self.step_signal

    def aux_loss(self) -> torch.Tensor:
        """ACT's ponder cost of the last forward (0 without ACT): `loss` adds it to the token loss."""
        if self._ponder is None:
            return torch.zeros(())
        return self.cfg.act_penalty * self._ponder

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, n)
        attention_mask: torch.Tensor | None = None,  # (B, n) bool, True at real tokens
        trace: dict[str, torch.Tensor] | None = None,
        select: torch.Tensor | None = None,  # (B, n) bool: decode only these positions
    ) -> torch.Tensor:
        cfg = self.cfg
        B, n = input_ids.shape
        if n > cfg.max_len:
            raise ValueError(f"sequence length {n} exceeds max_len={cfg.max_len}: raise max_len")
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        pos, steps = self.signals(n)
        x = self.tok_emb(input_ids)  # (B, n, d)
        if cfg.norm == "post":
            x = self.emb_ln(x)
        x = self.drop(x)
        if trace is not None:
            trace["embed"] = x
        scale = self.attn_scale()
        if cfg.act:
            x = self._act(x, keep, pos, steps, scale, trace)
        else:
            for t in range(cfg.n_steps):
                # --- depth: the step's timing signals are a per-step increment of the stream too: × m_L^-α ---
                b = self.layer.branch  # (x + b·pos) + b·step: at `none` (b = 1.0) exactly x + pos + step
                x = self.layer(x + b * pos + b * steps[t], keep, scale, trace, f"layer{t}")  # (B, n, d)
                # --- end depth ---
        if cfg.norm == "pre":
            x = self.emb_ln(x)
        return self.readout(x, select, trace)

    def _act(self, x: torch.Tensor, keep: torch.Tensor, pos: torch.Tensor, steps: torch.Tensor,
             scale: float | torch.Tensor, trace: dict[str, torch.Tensor] | None) -> torch.Tensor:
        """ACT over at most T steps (tensor2tensor's `ut_act`); every position runs every step, halted ones
        keep their output. Sets the ponder cost (mean over real tokens of steps used + remainder)."""
        assert self.halt is not None  # built with cfg.act
        B, n, _ = x.shape
        halting = x.new_zeros(B, n)  # cumulative halting probability
        remainders, updates = x.new_zeros(B, n), x.new_zeros(B, n)
        out = torch.zeros_like(x)
        mult = self.readout_mult() / self.cfg.output_mult  # μP: × d0/d like the decoder (1 when standard)
        for t in range(self.cfg.n_steps):
            b = self.layer.branch  # depth: the signals × m_L^-α like the branch (exactly x + pos + step at `none`)
            x = x + b * pos + b * steps[t]
            p = torch.sigmoid(self.halt(x * mult).squeeze(-1))  # (B, n)
            running = (halting < 1.0).to(x.dtype)
            total = halting + p * running
            new_halted = (total > self.cfg.act_threshold).to(x.dtype) * running
            running = (total <= self.cfg.act_threshold).to(x.dtype) * running
            halting = halting + p * running
            remainders = remainders + new_halted * (1 - halting)
            halting = halting + new_halted * remainders
            updates = updates + running + new_halted
            weight = (p * running + new_halted * remainders)[..., None]  # (B, n, 1)
            x = self.layer(x, keep, scale, trace, f"layer{t}")
            out = x * weight + out * (1 - weight)
        real = keep.to(x.dtype)
        self._ponder = ((updates + remainders) * real).sum() / real.sum()
        return out
