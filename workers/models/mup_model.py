"""The model of a `studies.family.from_mup` family: the plugin's own `nn.Module`, made μP by mup itself.

`MupModel(cfg)` calls the plugin's factory `make_model(width, vocab_size, **arch, **hparams)`; under μP it calls
`mup.set_base_shapes` against the same model at the base width and twice it (meta device: shapes only), under
standard `set_base_shapes(model, None)`; then the model's re-init method (`MupRecipe.init`, default `mup_init`),
and it trains with `mup.MuAdamW` (or `MuSGD`), groups `matrix` and `vector` (mup's) and `bias` (the biases and
norm gains, not decayed). `infshapes()` reports each parameter's infshape. `mup_problems` finds what mup's own
check cannot see from one model: parameters without an infshape, and hidden weights whose init std does not scale
as 1/√fan_in (`init_exponents`).

The forward maps token ids (B, T) to logits (B, T, V); a trace records every submodule's output by module path.
Each trial trains alone: mup's layers read their width from a parameter's `infshape`, which the stacked tensors of
a batched trial do not carry. The whole recipe: docs/families.md, docs/plugins.md.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import mup
import torch
from torch import nn

from studies.arch import ModelSize
from studies.family import FAMILIES, MupRecipe
from workers.errors import ConfigError
from workers.models.contract import ADAM_EPS, LanguageModel, check_groups, no_decay

SIZE_FIELDS = tuple(ModelSize.model_fields)  # what ptctl passes itself (width, vocab_size) or keeps (base, param.)


def recipe_of(cfg: Any) -> tuple[str, MupRecipe]:
    """The family name and mup recipe whose config `cfg` is."""
    for family in FAMILIES.values():
        if family.mup is not None and family.config is type(cfg):
            return family.name, family.mup
    raise ConfigError(f"{type(cfg).__name__} is no from_mup family's config: build the family with "
                      "studies.family.from_mup")


def factory(recipe: MupRecipe) -> Callable[..., nn.Module]:
    module, _, name = recipe.factory.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


class MupModel(LanguageModel):
    """A plugin's mup model under ptctl's contract (module docstring)."""

    def __init__(self, cfg: Any):
        super().__init__()
        self.cfg = cfg
        self.family, self.recipe = recipe_of(cfg)
        make = factory(self.recipe)
        kwargs = {k: v for k, v in cfg.model_dump().items() if k not in SIZE_FIELDS}
        asks = set(inspect.signature(make).parameters)  # a model with its own μP switch asks for these
        kwargs.update({k: getattr(cfg, k) for k in ("base_width", "parametrization") if k in asks})
        self.net = make(width=cfg.width, vocab_size=cfg.vocab_size, **kwargs)
        base = delta = None
        if cfg.parametrization == "mup":
            with torch.device("meta"):  # shapes only
                base = make(width=cfg.base_width, vocab_size=cfg.vocab_size, **kwargs)
                delta = make(width=2 * cfg.base_width, vocab_size=cfg.vocab_size, **kwargs)
        try:
            mup.set_base_shapes(self.net, base, delta=delta)
        except AssertionError as err:  # mup's check: a readout that is a plain nn.Linear
            raise ConfigError(f"model family {self.family!r}: mup.set_base_shapes refused the model: {err} "
                              "(the readout of a μP model is mup.MuReadout, or MuSharedReadout with tied "
                              "embeddings)") from None
        init = getattr(self.net, self.recipe.init, None) if self.recipe.init else None
        if callable(init):
            init()
        self.groups = {"all": list(self.net.parameters())}

    def make_optimizer(self, lr: float, weight_decay: float, betas: tuple[float, float], *, eps: float = ADAM_EPS,
                       width_eps: float = 1.0,
                       weight_decay_groups: Mapping[str, float] | None = None) -> torch.optim.Optimizer:
        """mup's optimizer over the model's parameters, its groups named (module docstring): `bias` holds the
        biases and norm gains (`contract.no_decay`), undecayed unless `weight_decay_groups` names it. MuAdamW's ε
        is `eps`, × `width_eps` in the matrix groups (those whose lr mup divides by width_mult; MuSGD has no ε);
        `weight_decay_groups` sets the decay of the named groups, which mup then scales as it scales
        `weight_decay` (MuAdamW: × width_mult in a matrix group)."""
        decays = dict(weight_decay_groups or {})
        kept = no_decay(self.net)
        # mup splits each group given into matrix-like and vector-like ones; with per-group decays, each group's
        # "weight_decay" first holds mup's own factor on it (decay 1)
        params = [{"params": [p for p in self.net.parameters() if (id(p) in kept) == held], "name": name,
                   "weight_decay": 1.0 if decays else 0.0 if held else weight_decay}
                  for name, held in (("", False), ("bias", True))]
        if self.recipe.optimizer == "sgd":
            opt: torch.optim.Optimizer = mup.MuSGD(params, lr=lr, momentum=betas[0])
        else:
            opt = mup.MuAdamW(params, lr=lr, betas=betas, eps=eps)
        opt.param_groups[:] = [g for g in opt.param_groups if g["params"]]
        defaults: dict[str, float] = {}  # each group's decay when weight_decay_groups does not name it
        for group in opt.param_groups:
            kind = "matrix" if max(p.infshape.ninf() for p in group["params"]) == 2 else "vector"
            base = group["name"] or kind
            group["name"] = base if base not in defaults else f"{base}_{sum(n.startswith(base) for n in defaults) + 1}"
            defaults[group["name"]] = 0.0 if base == "bias" else weight_decay
            if kind == "matrix" and self.recipe.optimizer != "sgd":
                group["eps"] = eps * width_eps
        check_groups(self.family, decays, defaults)
        if decays:
            for group in opt.param_groups:
                group["weight_decay"] *= decays.get(group["name"], defaults[group["name"]])
        return opt

    def infshapes(self) -> dict[str, str]:
        """Each parameter's infshape: 'd (base d0)' for a width dimension, 'n' for a finite one."""
        return {name: infshape_text(p) for name, p in self.net.named_parameters()}

    def run_params(self) -> dict[str, str]:
        return {f"infshape.{name}": text for name, text in self.infshapes().items()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                trace: dict[str, torch.Tensor] | None = None, select: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.net(input_ids) if trace is None else traced(self.net, input_ids, trace)
        return logits if select is None else logits[select]


def infshape_text(p: torch.Tensor) -> str:
    shape = getattr(p, "infshape", None)
    if shape is None:
        return "no infshape"
    return " × ".join(f"{d.dim} (base {d.base_dim})" if d.isinf() else str(d.dim) for d in shape)


def traced(net: nn.Module, input_ids: torch.Tensor, trace: dict[str, torch.Tensor]) -> torch.Tensor:
    """`net(input_ids)`, recording every submodule's tensor output by its path and the logits as `logits`."""
    seen: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Callable[[nn.Module, Any, Any], None]:
        def record(module: nn.Module, args: Any, out: Any) -> None:  # a block returning its last layer's output:
            if isinstance(out, torch.Tensor) and out.is_floating_point() and all(out is not o for o in seen.values()):
                seen[name] = out  # recorded once, under the innermost module
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in net.named_modules() if name]
    try:
        logits: torch.Tensor = net(input_ids)
    finally:
        for h in handles:
            h.remove()
    readouts = [out for name, out in seen.items() if isinstance(net.get_submodule(name), mup.MuReadout)]
    for name, out in seen.items():
        if out is not logits and not isinstance(net.get_submodule(name), mup.MuReadout):
            trace[name] = out
    # log-probabilities sit near -log V whatever the readout does: the check judges the readout's own output
    normalised = bool((logits.detach().float().logsumexp(-1).abs() < 1e-3).all())
    trace["logits"] = readouts[-1] if normalised and readouts else logits
    return logits


# ----------------------------------------------------------------------------- misuse
def mup_problems(models: Mapping[int, nn.Module]) -> list[str]:
    """What is wrong with the μP of a model built at each width of `models` (one line per parameter, naming it
    and the fix); [] when the models use no mup (no mup layer, no infshape) or nothing was found."""
    nets = {w: getattr(m, "net", m) for w, m in models.items()}
    any_net = next(iter(nets.values()))
    uses_mup = any(isinstance(m, mup.MuReadout) for m in any_net.modules()) or any(
        hasattr(p, "infshape") for p in any_net.parameters())
    if not uses_mup:
        return []
    missing = [n for n, p in any_net.named_parameters() if not hasattr(p, "infshape")]
    if missing:
        return [f"parameter {n!r} has no infshape: mup.set_base_shapes was never called on the model. Build the "
                f"family with studies.family.from_mup (it calls set_base_shapes), or call "
                f"mup.set_base_shapes(model, base, delta=delta) when the model is built" for n in missing[:3]]
    return [f"parameter {name!r}: its std·√fan_in at initialisation scales as width^{exponent:+.2f} (a std that "
            f"ignores width gives +0.50); μP keeps std·√fan_in constant for a hidden weight: draw it with std "
            f"σ/√fan_in (PyTorch's default for nn.Linear), or mup.init.normal_(p, std=σ/√base_fan_in) after "
            f"set_base_shapes" for name, exponent in init_exponents(nets).items() if abs(exponent) > INIT_TOL]


INIT_TOL = 0.2  # |log2-slope| of std·√fan_in: a width-independent std gives 0.5


def init_exponents(nets: dict[int, nn.Module]) -> dict[str, float]:
    """The log2-slope over width of std·√fan_in of every hidden weight (two width dimensions) at initialisation;
    zero-initialised ones are left out."""
    if len(nets) < 2:
        return {}
    widths = sorted(nets)
    scales: dict[str, list[float]] = {}
    for w in widths:
        for name, p in nets[w].named_parameters():
            shape = getattr(p, "infshape", None)
            if shape is not None and shape.ninf() == 2 and p.dim() == 2:
                scales.setdefault(name, []).append(float(p.detach().float().std()) * math.sqrt(p.shape[1]))
    x = [math.log2(w) for w in widths]
    out = {}
    for name, ys in scales.items():
        if len(ys) == len(widths) and min(ys) > 0:
            out[name] = _slope(x, [math.log2(y) for y in ys])
    return out


def _slope(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)
