"""TauGPT (Tauformer): a causal GPT whose attention scores keys by a Laplacian "taumode" scalar.

Per head vector x (after RoPE): E = xᵀLx / (xᵀx + ε), λ = E / (E + τ) ∈ [0, 1), and query i's logit on key j is
−|λq_i − λk_j| / T_h, in fp32 (spec §3–§4). L is a fixed D×D Laplacian shared by every layer and head
(`workers/laplacian.py`); τ is calibrated in the `before_step` hook; T_h = exp(s_h) is learned per head. `attention`:
"tau", its dot-product twin "dot" (spec §5.3 baseline a) or "uniform" (the causal mean, baseline b). Blocks are
nanochat-like (spec §4). `generate`'s `KVCache` keeps (V, λk), exact as λk depends on the key alone (spec §6).

μP (spec §7, Adam) sits in `# --- μP ---` blocks: hidden matrices lr × d0/d, every matrix std init_std/√fan_in,
lm_head read out output_mult · d0/d (`MuReadout`, `workers/models/common.py`). Width grows by heads at a fixed
head_dim, so the attention kernel is width-invariant and the λ logit needs no 1/D (spec §7.1). CompleteP sits in
`# --- depth ---` blocks. Rule by rule: docs/mup.md; the model: docs/families.md.
Shapes: B batch, T length, C width, H heads, G kv heads, D head_dim, V vocabulary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from analysis.taumode import collapse_warning
from studies.families.tauformer import TauConfig
from workers.batches import Batch
from workers.laplacian import chain_laplacian, knn_laplacian, load_laplacian, rotated
from workers.models.common import MuReadout, parameter
from workers.models.contract import LanguageModel

EPS = 1e-6
MASKED = -1e9  # the reference fills future positions with −1e9, not −inf
QUANTILES = (0.05, 0.5, 0.95)
logger = logging.getLogger(__name__)


def rms(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dimension (ε = 1e-6)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def taumode(x: torch.Tensor, lap: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, λ) of head vectors x (…, D) in fp32: E = xᵀLx / (xᵀx + ε) clamped at 0, λ = E / (E + τ)."""
    x = x.float()
    energy = (((x @ lap) * x).sum(-1) / (x.pow(2).sum(-1) + EPS)).clamp_min(0.0)  # (…)
    return energy, energy / (energy + tau.clamp_min(EPS))


def rope_tables(length: int, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (length, D/2) for the half-split convention: pair i has frequency base^(−2i/D)."""
    freqs = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * freqs  # (length, D/2)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + D/2) of x (B, H, T, D) by the angles in cos/sin (T, D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def _quantiles(values: torch.Tensor) -> list[float]:
    """p05, p50, p95 of `values` (of the first 10⁶ values: `torch.quantile` takes at most 2²⁴)."""
    kept = values.detach().float().flatten()[:1_000_000]
    return torch.quantile(kept, torch.tensor(QUANTILES, dtype=kept.dtype, device=kept.device)).tolist()


def temperature(log_temp: torch.Tensor) -> torch.Tensor:
    """T_h = exp(s_h) (H,) in fp32."""
    return log_temp.float().exp().clamp_min(EPS)


@dataclass(frozen=True)
class Kernel:
    """What each block's attention reads besides its input (the model's buffers and its temperature parameter):
    the RoPE tables (cos, sin) of the chunk's positions, the Laplacian, τ and the per-head log-temperatures s_h."""

    rope: tuple[torch.Tensor, torch.Tensor]
    laplacian: torch.Tensor
    tau: torch.Tensor
    log_temp: torch.Tensor


class KVCache:
    """Preallocated per-layer decode cache: (V, λk) for "tau" attention, (K, V) for "dot" and "uniform".

    V (and K) are stored in `dtype`; λk in fp32 always (spec §3.3: bf16 λ would add O(0.1) logit noise).
    """

    def __init__(self, cfg: TauConfig, batch: int, length: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        if length > cfg.max_len:
            raise ValueError(f"cache length {length} exceeds max_len={cfg.max_len}: raise max_len")
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, length, cfg.head_dim)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (layers, B, G, T, D)
        self.k: torch.Tensor | None
        self.lam: torch.Tensor | None
        if cfg.attention == "tau":
            self.lam = torch.zeros(shape[:-1], dtype=torch.float32, device=device)  # (layers, B, G, T)
            self.k = None
        else:
            self.k, self.lam = torch.zeros(shape, dtype=dtype, device=device), None
        self.pos = 0  # tokens cached so far: the next token's absolute position

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.lam) if t is not None]

    def nbytes(self, tokens: int | None = None) -> int:
        """Bytes held for `tokens` cached positions (default: all positions cached so far)."""
        tokens = self.pos if tokens is None else tokens
        return sum(t.element_size() * t[..., :tokens, :].numel() if t.dim() == 5 else
                   t.element_size() * t[..., :tokens].numel() for t in self.tensors())


class Attention(nn.Module):
    def __init__(self, cfg: TauConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C, D, H, G = cfg.width, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        self.c_q, self.c_k = nn.Linear(C, H * D, bias=False), nn.Linear(C, G * D, bias=False)
        self.c_v, self.c_proj = nn.Linear(C, G * D, bias=False), nn.Linear(H * D, C, bias=False)

    def heads(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, D), k and v (B, G, T, D): projected, clamped, RoPE'd and QK-normed (v: projected only)."""
        B, T, _ = x.shape
        D, clamp = self.cfg.head_dim, self.cfg.qkv_clamp
        q, k, v = ((proj(x).clamp(-clamp, clamp) if clamp > 0 else proj(x)).view(B, T, -1, D).transpose(1, 2)
                   for proj in (self.c_q, self.c_k, self.c_v))
        return rms(apply_rope(q, *rope)), rms(apply_rope(k, *rope)), v

    def forward(self, x: torch.Tensor, kernel: Kernel, layer: int, cache: KVCache | None,
                trace: dict[str, torch.Tensor] | None, stats: dict[str, torch.Tensor] | None) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        q, k, v = self.heads(x, kernel.rope)
        lam_q = lam_k = None
        if cfg.attention == "tau":
            e_q, lam_q = taumode(q, kernel.laplacian, kernel.tau)  # (B, H, T)
            e_k, lam_k = taumode(k, kernel.laplacian, kernel.tau)  # (B, G, T): before the kv-group expansion
            if stats is not None:
                for tag, value in (("E_q", e_q), ("E_k", e_k), ("lambda_q", lam_q), ("lambda_k", lam_k)):
                    stats[f"{tag}.layer{layer}"] = value
            if trace is not None:
                trace[f"lambda_q.layer{layer}"], trace[f"lambda_k.layer{layer}"] = lam_q, lam_k
        if cache is not None:  # append this chunk, then attend over everything cached
            pos, end = cache.pos, cache.pos + T
            cache.v[layer, :, :, pos:end] = v
            if cache.lam is not None:  # "tau" attention: λk is set
                assert lam_k is not None
                cache.lam[layer, :, :, pos:end] = lam_k
                lam_k = cache.lam[layer, :, :, :end]
            else:
                assert cache.k is not None  # a cache holds λk or K
                cache.k[layer, :, :, pos:end] = k
                k = cache.k[layer, :, :, :end]
            v = cache.v[layer, :, :, :end]
        group, Tk = cfg.kv_group, v.shape[2]
        future = torch.ones(T, Tk, dtype=torch.bool, device=x.device).triu(Tk - T + 1)  # diagonal offset Tk − T
        if cfg.attention == "dot" and trace is None and stats is None:  # the fused kernel (no logits needed)
            y = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=None if T == 1 else ~future,
                                               scale=1 / math.sqrt(cfg.head_dim), enable_gqa=group > 1)
            out: torch.Tensor = self.c_proj(y.transpose(1, 2).reshape(B, T, -1))
            return out
        v = v.repeat_interleave(group, 1)  # (B, H, Tk, D)
        if cfg.attention == "tau":
            assert lam_q is not None and lam_k is not None
            lam_k = lam_k.repeat_interleave(group, 1)  # (B, H, Tk)
            temp = temperature(kernel.log_temp).view(1, -1, 1, 1)  # (1, H, 1, 1)
            logits = -(lam_q[..., :, None] - lam_k[..., None, :]).abs() / temp  # (B, H, T, Tk), fp32
        elif cfg.attention == "dot":
            k = k.repeat_interleave(group, 1)
            logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(cfg.head_dim)
        else:
            logits = torch.zeros(B, cfg.n_heads, T, Tk, device=x.device)
        logits = logits.masked_fill(future, MASKED)
        att = torch.softmax(logits - logits.amax(-1, keepdim=True), -1)  # (B, H, T, Tk)
        if stats is not None:
            visible = torch.arange(Tk - T, Tk, device=x.device) + 1.0  # keys each query row sees
            entropy = -(att * att.clamp_min(1e-30).log()).sum(-1)  # (B, H, T)
            stats[f"entropy.layer{layer}"] = (entropy[..., visible > 1] / visible[visible > 1].log()).detach()
        if trace is not None:
            trace[f"attn_logits.layer{layer}"] = logits.masked_select(~future)
        y = (att @ v.to(att.dtype)).to(x.dtype).transpose(1, 2).reshape(B, T, -1)  # (B, T, H·D)
        projected: torch.Tensor = self.c_proj(y)
        return projected


class Block(nn.Module):
    def __init__(self, cfg: TauConfig, branch: float = 1.0) -> None:
        super().__init__()
        self.branch = branch  # the residual branches' multiplier: m_L^-α under a depth parametrization, else 1
        self.attn = Attention(cfg)
        self.fc = nn.Linear(cfg.width, 4 * cfg.width, bias=False)
        self.mlp_proj = nn.Linear(4 * cfg.width, cfg.width, bias=False)

    def forward(self, x: torch.Tensor, kernel: Kernel, layer: int, cache: KVCache | None,
                trace: dict[str, torch.Tensor] | None, stats: dict[str, torch.Tensor] | None) -> torch.Tensor:
        # --- depth (CompleteP, Table 1): x + m_L^-α · F(rms(x)); × 1.0 (exact) at `none` ---
        a = self.attn(rms(x), kernel, layer, cache, trace, stats)
        x = x + self.branch * a
        f = self.mlp_proj(F.relu(self.fc(rms(x))).square())  # ReLU²
        x = x + self.branch * f
        # --- end depth ---
        if trace is not None:
            trace[f"attn_out.layer{layer}"], trace[f"mlp_out.layer{layer}"], trace[f"hidden.layer{layer}"] = a, f, x
        return x


class TauGPT(MuReadout, LanguageModel):
    """`forward(input_ids)` returns next-token logits (B, T, V); `select` (B, T) decodes only those positions.

    `attention_mask` is accepted for the model contract and unused: attention is causal, and right-padding
    comes after every real token, so no real token sees it.
    """

    cfg: TauConfig
    log_temp: torch.Tensor  # an nn.Parameter when learned, else a buffer
    laplacian: torch.Tensor  # buffers
    tau: torch.Tensor
    calibrations: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: TauConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C, D, H = cfg.width, cfg.head_dim, cfg.n_heads
        self.wte = nn.Embedding(cfg.vocab_size, C)
        self.blocks = nn.ModuleList(Block(cfg, self.branch_mult()) for _ in range(cfg.n_layers))
        self.lm_head = nn.Linear(C, cfg.vocab_size, bias=False)  # untied
        log_temp = torch.full((H,), math.log(cfg.temperature))
        if cfg.learn_temperature and cfg.attention == "tau":
            self.log_temp = nn.Parameter(log_temp)  # s_h: T_h = exp(s_h)
        else:
            self.register_buffer("log_temp", log_temp)
        self.register_buffer("laplacian", self._laplacian())  # (D, D), shared by every layer and head
        self.register_buffer("tau", torch.tensor(float(cfg.tau)))
        self.register_buffer("calibrations", torch.tensor(0))  # how often τ was calibrated
        cos, sin = rope_tables(cfg.max_len + 1, D, cfg.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        groups = {"input": [parameter(self.wte.weight)], "hidden": list(self.blocks.parameters()),
                  "output": [parameter(self.lm_head.weight)],
                  "bias": [self.log_temp] if isinstance(self.log_temp, nn.Parameter) else []}
        # --- depth: the blocks' matrices in their own group (block) ---
        self.groups = self.depth_groups(groups, self.blocks)
        # --- end depth ---
        self._init()

    def _laplacian(self) -> torch.Tensor:
        cfg = self.cfg
        if cfg.laplacian == "chain":
            lap = chain_laplacian(cfg.head_dim)
        else:
            assert cfg.laplacian_path is not None  # TauConfig requires it for "knn" and "file"
            if cfg.laplacian == "file":
                lap = load_laplacian(cfg.laplacian_path, cfg.head_dim)
            else:
                lap = knn_laplacian(np.load(cfg.laplacian_path), cfg.head_dim, seed=cfg.laplacian_seed)
        return rotated(lap, cfg.laplacian_seed) if cfg.laplacian_rotate else lap

    @torch.no_grad()
    def _init(self) -> None:
        cfg = self.cfg
        self.wte.weight.normal_(0.0, cfg.embed_std)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                # Both parametrizations: std ∝ 1/√fan_in. Under μP this is the hidden rule (anchored by
                # construction, no base needed); the readout's is mup's MuReadout init with its d0/d multiplier.
                module.weight.normal_(0.0, cfg.init_std / math.sqrt(module.in_features))
        if cfg.zero_proj:
            for block in cast(Iterable[Block], self.blocks):  # nn.ModuleList yields nn.Module
                block.attn.c_proj.weight.zero_()
                block.mlp_proj.weight.zero_()

    def temperature(self) -> torch.Tensor:
        """T_h (H,) in fp32."""
        return temperature(self.log_temp)

    def rope(self, pos: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        if pos + length > self.cfg.max_len:
            raise ValueError(f"position {pos + length} exceeds max_len={self.cfg.max_len}: raise max_len")
        return self.rope_cos[pos:pos + length], self.rope_sin[pos:pos + length]

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # unused (see the class docstring)
        trace: dict[str, torch.Tensor] | None = None,  # filled with intermediates when given
        select: torch.Tensor | None = None,  # (B, T) bool: decode only these positions
        stats: dict[str, torch.Tensor] | None = None,  # filled with E, λ and attention entropies per layer
        cache: KVCache | None = None,  # decode: append to the cache and attend over it
    ) -> torch.Tensor:
        pos = cache.pos if cache is not None else 0
        kernel = Kernel(self.rope(pos, input_ids.shape[1]), self.laplacian, self.tau, self.log_temp)
        x = self.wte(input_ids)  # (B, T, C)
        if trace is not None:
            trace["embed"] = x
        for i, block in enumerate(self.blocks):
            x = block(x, kernel, i, cache, trace, stats)
        if cache is not None:
            cache.pos += input_ids.shape[1]
        x = rms(x)
        x = x if select is None else x[select]
        logits = F.linear(x * self.readout_mult(), self.lm_head.weight)  # (B, T, V) | (N, V)
        if self.cfg.logit_clamp > 0:
            logits = logits.clamp(-self.cfg.logit_clamp, self.cfg.logit_clamp)
        if trace is not None:
            trace["lm_logits"] = logits
        return logits

    # ------------------------------------------------------------------ τ calibration and monitoring
    def before_step(self, batch: Batch, step: int) -> None:
        """τ from the step's batch when due (`calibrate`)."""
        self.calibrate(batch.input_ids.to(self.tau.device), step)

    def eval_metrics(self, batch: Batch, step: int, past: list[dict[str, float]]) -> dict[str, float]:
        """`monitor` on the fixed batch, with `tau.collapse.<layer>` flags (0/1) from `analysis.taumode.
        collapse_warning` over the monitors so far (`past` and this one); a warning is logged once per layer."""
        stats = self.monitor(batch.input_ids.to(self.tau.device))
        verdict = collapse_warning(pd.DataFrame([*past, {"step": step, **stats}]))
        flagged = {f.layer for f in verdict.flags if f.step == step}
        layers = sorted({k.rsplit(".", 1)[1] for k in stats if k.startswith("tau.E_k.p50.")})
        newly = sorted(flagged - {f.layer for f in verdict.flags if f.step < step})
        if newly:
            logger.warning("step %d, %s: median E_k fell while its p05–p95 spread shrank (%s)", step,
                           ", ".join(newly), verdict.verdict)
        return {**stats, **{f"tau.collapse.{layer}": float(layer in flagged) for layer in layers}}

    @torch.no_grad()
    def block0_key_energies(self, input_ids: torch.Tensor) -> torch.Tensor:
        """E of block 0's post-RoPE key vectors on `input_ids`, flattened."""
        x = rms(self.wte(input_ids))
        _, k, _ = cast(Block, self.blocks[0]).attn.heads(x, self.rope(0, input_ids.shape[1]))
        return taumode(k, self.laplacian, self.tau)[0].flatten()

    @torch.no_grad()
    def calibrate(self, input_ids: torch.Tensor, step: int) -> float | None:
        """Set τ from `input_ids` when due: at step 0 and every `recalibrate_every` steps; returns the new τ.

        The first calibration sets τ to the median E of block 0's keys (median λ = 0.5 on that batch); later
        ones move τ to ema · τ + (1 − ema) · median. "fixed" τ is never calibrated.
        """
        cfg = self.cfg
        due = step == 0 or (cfg.recalibrate_every > 0 and step % cfg.recalibrate_every == 0)
        if cfg.tau_mode != "calibrate" or cfg.attention != "tau" or not due:
            return None
        median = float(self.block0_key_energies(input_ids).median().clamp_min(EPS))
        ema = cfg.recalibrate_ema if int(self.calibrations) > 0 else 0.0
        self.tau.fill_(ema * float(self.tau) + (1 - ema) * median)
        self.calibrations += 1
        return float(self.tau)

    @torch.no_grad()
    def monitor(self, input_ids: torch.Tensor) -> dict[str, float]:
        """Per-layer taumode statistics on `input_ids` (spec §3.1, §5.3), flat metric names.

        `tau.E_k.p50.layer0` etc. for E and λ of Q and K (p05, p50, p95), `tau.entropy.layer0` (mean attention
        entropy / ln(visible keys)), `tau.temperature.{min,mean,max}` and `tau.tau`.
        """
        stats: dict[str, torch.Tensor] = {}
        self(input_ids, stats=stats)
        out: dict[str, float] = {}
        for key, value in stats.items():
            tag, layer = key.split(".")
            if tag == "entropy":
                out[f"tau.entropy.{layer}"] = float(value.float().mean()) if value.numel() else math.nan
            else:
                for q, v in zip(("p05", "p50", "p95"), _quantiles(value), strict=True):
                    out[f"tau.{tag}.{q}.{layer}"] = v
        if self.cfg.attention != "tau":
            return out
        temps = self.temperature()
        out.update({"tau.temperature.min": float(temps.min()), "tau.temperature.mean": float(temps.mean()),
                    "tau.temperature.max": float(temps.max()), "tau.tau": float(self.tau)})
        return out

    # ------------------------------------------------------------------ generation
    def new_cache(self, batch: int, length: int, dtype: torch.dtype = torch.float32) -> KVCache:
        return KVCache(self.cfg, batch, length, dtype, self.wte.weight.device)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
                 softcap: float = 15.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding of `max_new_tokens` after `input_ids` (B, T0); returns (tokens, step logits).

        Logits pass a tanh softcap (reference: 15; 0: none) before the argmax. With `use_cache` the prompt is
        prefilled once and each step feeds one token; without, each step re-runs the full sequence.
        Step logits: (B, max_new_tokens, V), the logits each new token was chosen from.
        """
        tokens, steps = input_ids, []
        cache = self.new_cache(input_ids.shape[0], input_ids.shape[1] + max_new_tokens) if use_cache else None
        feed = tokens
        for _ in range(max_new_tokens):
            logits = self(feed, cache=cache)[:, -1]  # (B, V)
            if softcap > 0:
                logits = softcap * torch.tanh(logits / softcap)
            steps.append(logits)
            nxt = logits.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
            feed = nxt if use_cache else tokens
        return tokens, torch.stack(steps, 1)
