"""A Hugging Face causal LM (`transformers`' own code, unchanged) as a ptctl model, standard or μP.

`HFModel` builds `AutoModelForCausalLM.from_config` from `studies.families.hf.HFConfig.hf_kwargs` (nothing is
downloaded: it builds under HF_HUB_OFFLINE=1, `tests/workers/test_hf_family.py`) and owns the readout: the base
model's last hidden state → output_mult · h Wᵀ, W the lm_head's (tied: the input embedding's), so `select` decodes
only the scored positions. Attention runs through
transformers' attention interface under the name "ptctl" (`_attention`): SDPA at this model's own scale, one float
per attention module (`ptctl_scale`), so a batched member's attn_mult is stacked like any other attribute.

Standard is the model as HF builds it, with initializer_range = init_std (HF's init, HF's 1/√head_dim, one lr).
μP, in `# --- μP ---` blocks (Tensor Programs V, Table 8 for Adam, as mutransformers does for GPT-2):
  - init: HF's draw, then every hidden matrix × √(base_width/width) (std ∝ 1/√fan_in); embeddings and the
    readout as HF draws them (`zero_readout`: an untied readout at zero); vectors as HF sets them;
  - attention logits attn_mult · q·k / head_dim (checked at build time to have reached every layer);
  - the readout output_mult · (base_width/width) · h Wᵀ (tied or not: mup's MuSharedReadout / MuReadout);
  - Adam lr: the hidden group's × base_width/width; input, output and vectors unscaled.
Groups: input (embeddings), hidden (every other matrix), output (an untied lm_head), bias (biases and norm gains:
not decayed, as HF's Trainer and nanoGPT do). Rule by rule: docs/mup.md ("Hugging Face models").
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from studies.families.hf import HFConfig
from workers.errors import ConfigError, one_line
from workers.models.common import parameter
from workers.models.contract import LanguageModel, no_decay

IMPLEMENTATION = "ptctl"  # the attention interface's name for `_attention`
_seen: list[tuple[nn.Module, Any]] | None = None  # while `_calls` records: (module, scale) per attention call


def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, **kw: Any) -> Any:
    """transformers' SDPA attention at the module's `ptctl_scale` (HF's `scaling` until the model sets it)."""
    scale = module.__dict__.get("ptctl_scale", scaling)
    if _seen is not None:
        _seen.append((module, scale))
    if isinstance(scale, torch.Tensor):  # a batched member's own scale (stacked): SDPA takes a float
        query, scale = query * scale.to(query.dtype), 1.0
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scale, **kw)


AttentionInterface.register(IMPLEMENTATION, _attention)


class HFModel(LanguageModel):
    """A transformers causal LM under ptctl's contract (module docstring)."""

    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.cfg = cfg
        try:
            hf = AutoConfig.for_model(cfg.model_type, **cfg.hf_kwargs())
            hf._attn_implementation = IMPLEMENTATION
            self.lm = AutoModelForCausalLM.from_config(hf)  # type: ignore[no-untyped-call]
        except Exception as exc:  # the user's config: transformers' own complaint, named
            raise ConfigError(f"model.arch.config: transformers cannot build a {cfg.model_type} model from it "
                              f"({one_line(exc)}): fix or remove the key it names") from exc
        embeddings = [parameter(m.weight) for m in self.lm.modules() if isinstance(m, nn.Embedding)]
        readout = self.lm.get_output_embeddings()
        assert readout is not None, f"{cfg.model_type}: a causal LM without an output embedding"
        seen = {id(p) for p in embeddings}
        output = [] if id(readout.weight) in seen else [parameter(readout.weight)]
        kept = no_decay(self.lm)  # biases and norm gains
        seen |= {id(p) for p in output} | kept
        self.groups = {"input": embeddings, "hidden": [p for p in self.lm.parameters() if id(p) not in seen],
                       "output": output, "bias": [p for p in self.lm.parameters() if id(p) in kept]}
        self._init()
        self._set_attention_scale()
        self.readout_scale = self.readout_mult()

    def _mup(self) -> bool:
        return self.cfg.parametrization == "mup"

    @torch.no_grad()
    def _init(self) -> None:
        """HF's init at initializer_range = init_std (its draw is N(0, initializer_range) and its own per-layer
        rules, e.g. GPT-2's c_proj), then μP's width rule."""
        ratio = self.cfg.init_std / self.lm.config.initializer_range
        for p in self.groups["input"] + self.groups["hidden"] + self.groups["output"]:
            p.mul_(ratio)
        if self._mup():
            # --- μP: hidden matrices' std × √(base_width/width) (∝ 1/√fan_in); the readout optionally at zero ---
            for p in self.groups["hidden"]:
                p.mul_(math.sqrt(1.0 / self.cfg.width_mult))
            if self.cfg.zero_readout:
                for p in self.groups["output"]:
                    p.zero_()
            # --- end μP ---

    def _calls(self) -> list[tuple[nn.Module, Any]]:
        """(attention module, scale) of each attention call in one forward on 2 tokens."""
        global _seen
        _seen = []
        try:
            with torch.no_grad():
                self.lm(input_ids=torch.zeros(1, 2, dtype=torch.long))
            return _seen
        finally:
            _seen = None

    def _set_attention_scale(self) -> None:
        """Each attention module's scale: attn_mult × HF's own (standard), or attn_mult / head_dim (μP), once a
        forward has shown that every layer's attention runs through `_attention` (where the scale takes effect)."""
        calls = dict(self._calls())  # module -> the scale HF passes it
        if len(calls) != self.cfg.n_layers:
            raise ConfigError(f"model.arch.model_type={self.cfg.model_type!r}: {len(calls)} of its {self.cfg.n_layers} "
                              "layers' attention ran through transformers' attention interface, so ptctl cannot set "
                              "the attention scale of the others: choose a model_type ptctl supports "
                              "(studies/families/hf.py RULES)")
        head_dim = self.cfg.heads_at(self.cfg.width)[2]
        for module, hf_scale in calls.items():
            scale = self.cfg.attn_mult * (1.0 / math.sqrt(head_dim) if hf_scale is None else float(hf_scale))
            if self._mup():
                # --- μP: attention logits attn_mult · q·k / head_dim ---
                scale = self.cfg.attn_mult / head_dim
                # --- end μP ---
            setattr(module, "ptctl_scale", scale)  # noqa: B010 (a float attribute, stacked per member)

    def readout_mult(self) -> float:
        """The logits' multiplier: output_mult, × base_width/width under μP."""
        if self._mup():
            # --- μP: readout output_mult · d0/d (mup's MuReadout; tied: MuSharedReadout) ---
            return self.cfg.output_mult / self.cfg.width_mult
            # --- end μP ---
        return self.cfg.output_mult

    def lr_multipliers(self) -> dict[str, float]:
        """Per-group factors on the base lr (μP: the hidden group's base_width/width, as mup's MuAdamW)."""
        hidden = 1.0
        if self._mup():
            # --- μP: Adam learning rates, hidden ∝ d0/d; input, output (read out × d0/d) and vectors unscaled ---
            hidden = 1.0 / self.cfg.width_mult
            # --- end μP ---
        return {"input": 1.0, "hidden": hidden, "output": 1.0, "bias": 1.0}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                trace: dict[str, torch.Tensor] | None = None, select: torch.Tensor | None = None) -> torch.Tensor:
        out = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                 output_hidden_states=trace is not None)
        h = out.last_hidden_state  # (B, n, d), after the final norm
        if trace is not None:
            trace["embedding"] = out.hidden_states[0]
            *layers, final = out.hidden_states[1:]  # each layer's output; the last layer's after the final norm
            for i, state in enumerate(layers):
                trace[f"hidden.layer{i}"] = state
            trace["final_norm"] = final
        if select is not None:
            h = h[select]
        weight = self.lm.get_output_embeddings().weight
        logits = F.linear(h * self.readout_scale, weight)
        if trace is not None:
            trace["logits"] = logits
        return logits
