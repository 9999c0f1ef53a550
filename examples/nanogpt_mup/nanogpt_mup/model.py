"""A small causal GPT in the style of nanoGPT, parametrized with mup: `MuReadout` as the readout, attention
scaled by 1/head size (μP) instead of 1/√head size, and `mup_init`, which ptctl calls after `mup.set_base_shapes`,
drawing every weight through `mup.init` so its std scales with width as μP asks."""

import math

import mup
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int, n_heads: int, attn_mult: float):
        super().__init__()
        self.n_heads, self.attn_mult = n_heads, attn_mult
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=2))
        # μP: 1/head size, not 1/√head size (mup's README, "attention logits")
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.attn_mult / q.shape[-1])
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, width: int, n_heads: int, attn_mult: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, n_heads, attn_mult)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, width: int, vocab_size: int, n_layers: int, n_heads: int, max_len: int,
                 output_mult: float, attn_mult: float, init_std: float):
        super().__init__()
        self.init_std = init_std
        self.tokens, self.positions = nn.Embedding(vocab_size, width), nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, n_heads, attn_mult) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(width)
        self.readout = mup.MuReadout(width, vocab_size, bias=False, output_mult=output_mult)  # μP: the readout

    def mup_init(self) -> None:
        """Called by ptctl once the base shapes are set: std = init_std / √(base fan_in) at the base width, scaled
        by mup.init as μP asks at every other width; the readout starts at zero."""
        for name, p in self.named_parameters():
            if name.startswith("readout"):
                nn.init.zeros_(p)
            elif p.dim() == 2 and not name.startswith(("tokens", "positions")):
                mup.init.normal_(p, std=self.init_std / math.sqrt(p.infshape[1].base_dim or p.shape[1]))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        return self.readout(self.ln_f(x))


def make_model(width: int, vocab_size: int, **arch_and_hparams: float) -> GPT:
    """ptctl's factory: the model at `width`, its arch fields and hparams as keywords."""
    return GPT(width, vocab_size, **arch_and_hparams)  # type: ignore[arg-type]
