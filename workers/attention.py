"""The attention logits of any model, traced: `traced_attention(model, trace)` records q·kᵀ × scale of every
`torch.nn.functional.scaled_dot_product_attention` call the model makes while it is active, as
`trace["attn_logits.<module path>"]` (the innermost of the model's modules running at the call), the positions
attention may use only (its mask, or the causal triangle). Through it the coordinate check and the door see the
attention of models that never materialise the scores: SDPA-based plugins, and `transformers`' attention
interface (`workers.models.hf` routes it through SDPA). A model that traces its own logits (the built-ins'
explicit path under `trace`) calls no SDPA while traced, so nothing is recorded twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from analysis.constants import ATTENTION


@contextmanager
def traced_attention(model: nn.Module, trace: dict[str, torch.Tensor],
                     head_dims: dict[str, int] | None = None) -> Iterator[None]:
    """Record the attention logits of `model`'s SDPA calls into `trace` (module docstring), and each call's head
    size into `head_dims` when given."""
    names = {id(m): name for name, m in model.named_modules()}
    running: list[nn.Module] = []
    sdpa = F.scaled_dot_product_attention

    def recording(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False, **kw: Any) -> torch.Tensor:
        where = next((names[id(m)] for m in reversed(running) if id(m) in names), "")
        name = f"{ATTENTION}{where}" if where else ATTENTION.rstrip(".")
        trace[name] = _logits(query, key, attn_mask, is_causal, scale, enable_gqa)
        if head_dims is not None:
            head_dims[name] = query.shape[-1]
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa, **kw)

    def leave(module: nn.Module, args: Any, out: Any) -> None:  # a forward hook's return value would replace `out`
        if running:
            running.pop()

    def enter(module: nn.Module, args: Any) -> None:
        running.append(module)

    pre = register_module_forward_pre_hook(enter)
    post = register_module_forward_hook(leave)
    torch.nn.functional.scaled_dot_product_attention = recording
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        pre.remove()
        post.remove()


def _logits(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
            scale: float | None, gqa: bool) -> torch.Tensor:
    """SDPA's pre-softmax logits at the positions it lets a query see, flattened."""
    if gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    logits = (query @ key.transpose(-2, -1)).detach() * factor
    seen = torch.ones(logits.shape[-2:], dtype=torch.bool, device=logits.device)
    if is_causal:
        seen = seen.tril()
    if mask is not None:
        seen = seen & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2)
    return logits.masked_select(seen.expand_as(logits))
