"""The model contract: what `workers.train.train_trial` and `workers.coord_check` call on every family.

A family's model subclasses `LanguageModel` and provides `groups` (group → parameters), `lr_multipliers()` (group
→ factor on the base lr; μP lives here), optionally `eps_multipliers()` and `width_groups()`, and
`forward(input_ids, attention_mask, trace=None, select=None)` (logits; `trace` collects named activations, `select`
decodes only those positions). It owns its loss: `loss(batch)` is the scored tokens' cross-entropy plus
`aux_loss()` (UT: ACT's ponder cost; PT: the ‖T‖ penalty). The hooks are no-ops unless overridden:
`before_trial(config)` once (PT: its penalty weight), `before_step(batch, step)` before each step (TauGPT: τ
calibration), `eval_metrics(batch, step, past)` at each evaluation on a fixed held-out batch, whose keys become
per-step metrics of the trial's run (TauGPT: `tau.*`). The whole contract: docs/plugins.md §2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from studies.family import get_family
from workers.batches import Batch
from workers.errors import ConfigError
from workers.models.common import token_loss

ADAM_EPS = 1e-8  # Adam's ε (torch's default; `Family.adam_eps`), times a group's `eps_multipliers()` factor
UNDECAYED = ("bias", "block_bias")  # biases and norm gains (`no_decay`): no weight decay unless
# `train.weight_decay_groups` names them (the built-ins' groups; a from_mup family's `bias`)
WIDTH_GROUPS = ("hidden", "block")  # the groups whose lr μP divides by width_mult (`width_groups()`; PT adds output)
MATRIX_GROUPS = ("hidden", "block")  # the groups whose 2-D parameters Muon trains (`matrices()`; the hidden weights)

class LanguageModel(nn.Module):
    """Base class of every family's model (module docstring)."""

    groups: dict[str, list[nn.Parameter]]

    def lr_multipliers(self) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} must define lr_multipliers()")

    def eps_multipliers(self) -> dict[str, float]:
        """Per-group factors on Adam's ε (a group left out: 1)."""
        return {}

    def width_groups(self) -> tuple[str, ...]:
        """The groups whose learning rate μP divides by width_mult (`lr_multipliers`): under
        `train.adam_eps_scaling: width` their ε is multiplied by base_width/width too."""
        return WIDTH_GROUPS

    def matrices(self) -> dict[str, int]:
        """The parameters `train.optimizer: muon` trains with Muon, by name → the dimension that is their fan-in (-1:
        nn.Linear's (out, in) layout; -2: an (in, out) weight applied as x @ W). Each is a matrix in its last two
        dimensions; leading ones stack independent matrices, each orthogonalised alone. Default: every 2-D
        parameter of the MATRIX_GROUPS (the hidden weights); embeddings, readout and vectors stay on AdamW."""
        names = {id(p): n for n, p in self.named_parameters()}
        return {names[id(p)]: -1 for g in MATRIX_GROUPS for p in self.groups.get(g, []) if p.dim() == 2}

    def base_shapes(self) -> dict[str, torch.Size]:
        """Each parameter's shape at the base width, which the μP rule for Muon compares with its shape here
        (docs/mup.md): the same model built at `self.cfg.base_width` on the meta device (shapes only, no draw)."""
        cfg: Any = getattr(self, "cfg", None)
        base_width = getattr(cfg, "base_width", None)
        if not (isinstance(cfg, BaseModel) and isinstance(base_width, int)):
            raise ConfigError(f"{type(self).__name__} keeps no config with base_width as `self.cfg`, which "
                              "train.optimizer: muon under mup reads to size its matrices at the base width: store "
                              "it there, or override base_shapes()")
        if base_width == getattr(cfg, "width", None):
            return {n: p.shape for n, p in self.named_parameters()}
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            base = type(self)(type(cfg).model_validate({**cfg.model_dump(), "width": base_width}))
        return {n: p.shape for n, p in base.named_parameters()}

    def width_ratio(self) -> float:
        """base_width / width of the built model, from its config (`self.cfg`, a `studies.arch.ModelSize`)."""
        cfg: Any = getattr(self, "cfg", None)
        if not (isinstance(getattr(cfg, "width", None), int) and isinstance(getattr(cfg, "base_width", None), int)):
            raise ConfigError(f"{type(self).__name__} keeps no config with width and base_width as `self.cfg`, "
                              "which train.adam_eps_scaling: width reads: store it there, or override width_ratio()")
        return float(cfg.base_width / cfg.width)

    def token_loss(self, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy per scored position (MLM: the masked ones; causal LM: every next token), decoding
        only those (the |V|-wide head dominates the step otherwise)."""
        batch = batch.to(next(self.parameters()).device)
        select = batch.labels != -100
        logits = self(batch.input_ids, batch.attention_mask, select=select)
        return token_loss(logits, batch.labels[select])

    def aux_loss(self) -> torch.Tensor | None:
        """The family's extra loss terms after a forward pass (None: none)."""
        return None

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss on `batch` and its terms (detached): `token_loss`, and `aux_loss` when there is one."""
        tokens = self.token_loss(batch)
        aux = self.aux_loss()
        if aux is None:
            return tokens, {"token_loss": tokens.detach()}
        return tokens + aux.to(tokens.device), {"token_loss": tokens.detach(), "aux_loss": aux.detach()}

    def make_optimizer(self, lr: float, weight_decay: float, betas: tuple[float, float], *, eps: float = ADAM_EPS,
                       width_eps: float = 1.0,
                       weight_decay_groups: Mapping[str, float] | None = None) -> torch.optim.Optimizer | None:
        """The model's own optimiser at base lr `lr` (None: ptctl's AdamW over `groups` with `lr_multipliers`;
        a mup family: mup's MuAdamW). Each group carries a "name". `eps`: Adam's ε; `width_eps`: the factor on the
        ε of the groups whose lr μP scales with width (`train.adam_eps_scaling`); `weight_decay_groups`: the decay
        of the groups named (an unknown name: `check_groups`'s ConfigError)."""
        return None

    def run_params(self) -> dict[str, str]:
        """Facts about the built model logged as its trial run's params (a mup family: each parameter's
        infshape)."""
        return {}

    # ------------------------------------------------------------------ hooks (no-ops by default)
    def before_trial(self, config: Any) -> None:
        """Called once with the trial's `TrialConfig` before training."""

    def before_step(self, batch: Batch, step: int) -> None:
        """Called before each training step; `step` counts the updates done so far (0 first)."""

    def eval_metrics(self, batch: Batch, step: int, past: list[dict[str, float]]) -> dict[str, float]:
        """Extra metrics at an evaluation after `step` updates, on a fixed held-out `batch`; `past` holds the rows
        this hook returned at earlier evaluations (with their `step`)."""
        return {}


def no_decay(module: nn.Module) -> set[int]:
    """The ids of `module`'s biases and norm gains, which weight decay leaves alone by default (as HF's Trainer and
    nanoGPT do): every parameter of fewer than 2 dimensions, and every parameter of a normalisation layer (a module
    whose class name holds "Norm": LayerNorm, RMSNorm, GroupNorm, BatchNorm1d, a plugin's own)."""
    norms = {id(p) for m in module.modules() if "Norm" in type(m).__name__ for p in m.parameters(recurse=False)}
    return norms | {id(p) for p in module.parameters() if p.dim() < 2}


def check_groups(family: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """A ConfigError naming `family`, the unknown group names of `train.weight_decay_groups` and the valid ones."""
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ConfigError(f"model family {family!r} has no parameter group(s) {unknown} named in "
                          f"train.weight_decay_groups: its groups are {sorted(set(valid))}")


def adam_eps(model: LanguageModel, cfg: Any) -> tuple[float, float]:
    """Adam's ε for trial config `cfg` (`train.adam_eps`, else the family's `Family.adam_eps`) and the factor on
    it in the groups whose lr μP scales with width (`train.adam_eps_scaling`: base_width/width under 'width')."""
    eps = cfg.adam_eps if cfg.adam_eps is not None else get_family(cfg.model).adam_eps
    return eps, model.width_ratio() if cfg.adam_eps_scaling == "width" else 1.0


def adam_settings(model: LanguageModel, family: str, eps: float, width_eps: float, weight_decay: float,
                  weight_decay_groups: Mapping[str, float] | None,
                  form: str = "coupled") -> dict[str, tuple[float, float]]:
    """Each of `model.groups`' (ε, weight decay) in ptctl's AdamW: `eps` × the group's `eps_multipliers()` factor
    (× `width_eps` in its `width_groups()`), and `weight_decay_groups`' decay where it names the group, else 0 in
    the UNDECAYED groups and `weight_decay` in the others. `form` (`train.weight_decay_form`): 'coupled', that
    decay as it is (torch's AdamW decays a group by its own lr × decay per step); 'independent', divided by the
    group's `lr_multipliers()` factor, so that its lr × decay is the base lr × decay in every group."""
    decays = dict(weight_decay_groups or {})
    check_groups(family, decays, model.groups)
    mult, scaled = model.eps_multipliers(), model.width_groups()
    lr_mults = model.lr_multipliers() if form == "independent" else {}
    return {name: (eps * mult.get(name, 1.0) * (width_eps if name in scaled else 1.0),
                   decays.get(name, 0.0 if name in UNDECAYED else weight_decay) / lr_mults.get(name, 1.0))
            for name in model.groups}
