"""BERT-style MLM encoder (Devlin et al. 2019) in the standard parametrization and in μP (Yang et al. 2022).

Embeddings (tokens + learned positions) → L layers (pre- or post-LN, GELU FFN) → MLM head (BERT's transform,
optional) → a decoder tied to the token embedding or not. Width is d_model; n_heads = max(1, round(d / head_dim))
and attention runs in a = n_heads·head_dim dimensions (a = d when head_dim divides d), so any width builds and a
parameter budget can be met to the percent.

μP (mup's rules, Tensor Programs V Table 8, Adam) sits in `# --- μP ---` blocks, implemented here rather than
through `mup.set_base_shapes` because a model rebuilt from hparams in every trial has no base model to attach
infshapes from; `tests/workers/test_baselines.py` checks the groups against mup's. Hidden std init_std/√(d/d0) and
lr × d0/d; logits output_mult · (d0/d) · x Wᵀ; attention attn_mult · q·k / head_dim. CompleteP sits in
`# --- depth ---` blocks. Standard: every weight N(0, init_std), one lr. Rule by rule: docs/mup.md.
Shapes: B batch, n length, d width, a attention width, H heads, f FFN width, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from studies.families.bert import BertConfig
from studies.families.ut import UTConfig
from workers.models.common import MuReadout
from workers.models.contract import LanguageModel


class Layer(nn.Module):
    """One Transformer layer: self-attention and a GELU FFN, each with a residual and a LayerNorm."""

    def __init__(self, d: int, n_heads: int, head_dim: int, d_ff: int, norm: str, dropout: float,
                 branch: float = 1.0) -> None:
        super().__init__()
        a = n_heads * head_dim
        self.n_heads, self.head_dim, self.norm = n_heads, head_dim, norm
        self.branch = branch  # the residual branches' multiplier: m_L^-α under a depth parametrization, else 1
        self.q, self.k, self.v, self.o = nn.Linear(d, a), nn.Linear(d, a), nn.Linear(d, a), nn.Linear(a, d)
        self.ff1, self.ff2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)

    def attention(self, x: torch.Tensor, keep: torch.Tensor, scale: float | torch.Tensor,
                  trace: dict[str, torch.Tensor] | None, tag: str) -> torch.Tensor:
        B, n, _ = x.shape
        q, k, v = (proj(x).view(B, n, self.n_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))  # (B, H, n, head_dim)
        mask = keep[:, None, None, :]  # (B, 1, 1, n): attend to real tokens only
        if isinstance(scale, torch.Tensor):  # a batched trial's per-member attn_mult: SDPA takes a float scale
            q, scale = q * scale, 1.0
        if trace is None:
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                 dropout_p=self.drop.p if self.training else 0.0)
        else:  # the explicit path, so the logits can be traced
            logits = scale * (q @ k.transpose(-1, -2))  # (B, H, n, n)
            trace[f"attn_logits.{tag}"] = logits.masked_select(mask & keep[:, None, :, None])
            ctx = self.drop(torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)) @ v
        out: torch.Tensor = self.o(ctx.transpose(1, 2).reshape(B, n, -1))  # (B, n, d)
        return out

    def forward(self, x: torch.Tensor, keep: torch.Tensor, scale: float | torch.Tensor,
                trace: dict[str, torch.Tensor] | None = None, tag: str = "layer0") -> torch.Tensor:
        if self.norm == "pre":
            # --- depth (CompleteP, Table 1): x + m_L^-α · F(LN(x)); × 1.0 (exact) at `none` ---
            a = self.attention(self.ln1(x), keep, scale, trace, tag)
            x = x + self.branch * self.drop(a)
            f = self.ff2(F.gelu(self.ff1(self.ln2(x))))
            x = x + self.branch * self.drop(f)
            # --- end depth ---
        else:
            a = self.attention(x, keep, scale, trace, tag)
            x = self.ln1(x + self.drop(a))
            f = self.ff2(F.gelu(self.ff1(x)))
            x = self.ln2(x + self.drop(f))
        if trace is not None:
            trace[f"attn_out.{tag}"], trace[f"ffn_out.{tag}"], trace[f"hidden.{tag}"] = a, f, x
        return x


class MLMHead(nn.Module):
    """BERT's transform (optional) and the decoder, tied to `embedding` or its own d → V matrix."""

    def __init__(self, d: int, vocab: int, transform: bool, embedding: nn.Embedding | None) -> None:
        super().__init__()
        self.dense = nn.Linear(d, d) if transform else None
        self.ln = nn.LayerNorm(d) if transform else None
        self.embedding = embedding  # tied: the token embedding (registered once, by the model)
        self.decoder = None if embedding is not None else nn.Linear(d, vocab, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab))

    @property
    def weight(self) -> torch.Tensor:
        if self.embedding is not None:
            return self.embedding.weight
        assert self.decoder is not None  # untied: built with its own matrix
        return self.decoder.weight

    def forward(self, x: torch.Tensor, mult: float) -> torch.Tensor:
        if self.dense is not None:
            assert self.ln is not None  # built with the dense layer (mlm_transform)
            x = self.ln(F.gelu(self.dense(x)))
        return F.linear(x * mult, self.weight, self.bias)  # (…, V)


class Encoder(MuReadout, LanguageModel):
    """What BERT and UT share: parameter groups, μP init, the readout; μP lr multipliers and readout scale
    from `MuReadout`."""

    cfg: BertConfig | UTConfig
    head: MLMHead

    def _group(self) -> None:
        """Sort every parameter into input / hidden / output / bias (docs/mup.md's BERT table)."""
        inputs = [p for name, p in self.named_parameters() if name.endswith("_emb.weight")]
        outputs = [p for name, p in self.named_parameters() if name.endswith(("decoder.weight", "halt.weight"))]
        seen = {id(p) for p in inputs + outputs}
        hidden = [p for p in self.parameters() if p.dim() == 2 and id(p) not in seen]
        vectors = [p for p in self.parameters() if p.dim() == 1]
        groups = {"input": inputs, "hidden": hidden, "output": outputs, "bias": vectors}
        # --- depth: the residual blocks' parameters in their own groups (block, block_bias) ---
        self.groups = self.depth_groups(groups, self.blocks())
        # --- end depth ---

    def blocks(self) -> nn.Module:
        """The residual blocks (BERT: its layers; UT: its one shared layer)."""
        raise NotImplementedError

    @torch.no_grad()
    def _init(self) -> None:
        cfg = self.cfg
        std = cfg.init_std
        for p in self.groups["bias"]:
            p.zero_()
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
        for p in self.groups["input"] + self.groups["output"]:
            p.normal_(0.0, std)
        hidden_std = std
        if cfg.parametrization == "mup":
            # --- μP: init (hidden std ∝ 1/√fan_in, anchored at base_width) ---
            hidden_std = std / math.sqrt(cfg.width_mult)
            # --- end μP ---
        for p in self.groups["hidden"]:
            p.normal_(0.0, hidden_std)
        if cfg.zero_query:  # mup's recommended options, honoured under either parametrization
            for module in self.modules():
                if isinstance(module, Layer):
                    module.q.weight.zero_()
        if cfg.zero_readout:
            for p in self.groups["output"]:
                p.zero_()

    def attn_scale(self) -> float:
        cfg = self.cfg
        if cfg.parametrization == "mup":
            # --- μP: attention logits q·k / head_dim (mup's 1/d; a constant while head_dim is fixed) ---
            return cfg.attn_mult / cfg.head_dim
            # --- end μP ---
        return cfg.attn_mult / math.sqrt(cfg.head_dim)

    def readout(self, x: torch.Tensor, select: torch.Tensor | None, trace: dict[str, torch.Tensor] | None
                ) -> torch.Tensor:
        logits: torch.Tensor = self.head(x if select is None else x[select], self.readout_mult())  # (B, n, V) | (N, V)
        if trace is not None:
            trace["mlm_logits"] = logits
        return logits


class Bert(Encoder):
    """BERT encoder + MLM head. `forward(input_ids, attention_mask)` returns (B, n, V) logits.

    With `select` (a (B, n) mask, e.g. `labels != -100`) only the selected positions are decoded.
    """

    cfg: BertConfig

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, V = cfg.width, cfg.vocab_size
        self.tok_emb = nn.Embedding(V, d)  # (V, d)
        self.pos_emb = nn.Embedding(cfg.max_len, d)  # (max_len, d), learned absolute positions
        self.emb_ln = nn.LayerNorm(d)  # post-LN: after the embeddings; pre-LN: the final LN
        self.layers = nn.ModuleList(Layer(d, cfg.n_heads, cfg.head_dim, cfg.ffn_mult * d, cfg.norm, cfg.dropout,
                                          self.branch_mult()) for _ in range(cfg.n_layers))
        self.head = MLMHead(d, V, cfg.mlm_transform, self.tok_emb if cfg.tie_decoder else None)
        self.drop = nn.Dropout(cfg.dropout)
        self._group()
        self._init()

    def blocks(self) -> nn.Module:
        return self.layers

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, n)
        attention_mask: torch.Tensor | None = None,  # (B, n) bool, True at real tokens
        trace: dict[str, torch.Tensor] | None = None,  # filled with intermediates when given
        select: torch.Tensor | None = None,  # (B, n) bool: decode only these positions
    ) -> torch.Tensor:
        B, n = input_ids.shape
        if n > self.cfg.max_len:
            raise ValueError(f"sequence length {n} exceeds max_len={self.cfg.max_len}: raise max_len")
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.tok_emb(input_ids) + self.pos_emb.weight[:n]  # (B, n, d)
        if self.cfg.norm == "post":
            x = self.emb_ln(x)
        x = self.drop(x)
        if trace is not None:
            trace["embed"] = x
        scale = self.attn_scale()
        for i, layer in enumerate(self.layers):
            x = layer(x, keep, scale, trace, f"layer{i}")  # (B, n, d)
        if self.cfg.norm == "pre":
            x = self.emb_ln(x)
        return self.readout(x, select, trace)
