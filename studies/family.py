"""The model families, each one registration: `register(Family(...))` is everything the rest of ptctl knows
about a family.

A `Family` names its arch, model config, search space, data objective, readout trace name, the coordinate check's
model, its parameter and FLOP counts (`studies.budget`) and its `nn.Module` as a "module:Class" path, so
`studies` imports no torch. Specs, trial configs and every error message or schema (`family_names()`) look
families up here. The built-ins are one module each under `studies/families/`.

Plugins: an entry point in the group `ptctl.families`, named after its family, whose object is a `Family` (or a
function of no arguments returning one). `import studies` registers them once per process after the built-ins,
so every later schema, error and Ray worker sees them; a plugin that fails any check is skipped with one warning.
`from_mup` makes the family of a model built with mup. The contract: docs/plugins.md, docs/families.md.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, create_model

from studies.arch import ANY_LENGTH, ModelSize
from studies.space import Space

Objective = Literal["mlm", "clm"]
ENTRY_POINT_GROUP = "ptctl.families"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a family name: spec values, file names, MLflow tags
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    """One model family (module docstring)."""

    name: str
    arch: type[BaseModel]  # what a study fixes (`model.arch`): a `studies.arch.Arch`, or a model with `width_steps`
    config: type[BaseModel]  # what the model is built from: the arch, `ModelSize` and the hparams
    space: type[Space]  # the search space of its hparams
    model: str | type  # its nn.Module: "module:Class" (imported by `workers.models`), or the class itself
    objective: Objective = "mlm"  # masked tokens, or next tokens ("clm")
    readout: str = "mlm_logits"  # the output logits' name in a trace
    coord_hp: dict[str, Any] = field(default_factory=dict)  # the coordinate check's small model
    # the coordinate check's model hparams -> the activations (name prefixes) μP lets shrink with width, judged
    # one-sidedly like the readout
    coord_may_vanish: Callable[[dict[str, Any]], tuple[str, ...]] = lambda hp: ()
    flag_tags: dict[str, str] = field(default_factory=dict)  # metric prefix -> the trial run's tag when one is nonzero
    param_count: Callable[..., int] | None = None  # (arch, width, vocab_size, base_width) -> parameters
    forward_flops: Callable[..., dict[str, float]] | None = None  # (arch, width, vocab, seq_len, n_dec, base_width)
    width_multiples: bool = False  # the budget solver steps by `width_step` (PT) instead of every integer
    mup: MupRecipe | None = None  # a `from_mup` family: how its model is built and trained (trained alone, unbatched)
    # the hparams in which the members of one batched model may differ (`workers.batched`: each member's own values
    # reach its forward through its config, attributes and buffers, stacked); None: its trials train one at a time
    batchable: tuple[str, ...] | None = None
    adam_eps: float = 1e-8  # Adam's ε when `train.adam_eps` is null (torch's default; a hand-written GPT: 1e-12)
    paradigms: tuple[str, ...] = ()  # the coordinate check's --paradigm values (its config's `paradigm`), default first

    @property
    def comparable(self) -> bool:
        """Whether a compare study takes this family: an MLM family with parameter and FLOP counts."""
        return self.objective == "mlm" and self.param_count is not None and self.forward_flops is not None


@dataclass(frozen=True)
class MupRecipe:
    """How `workers.models.mup_model.MupModel` builds and trains the model of a `from_mup` family."""

    factory: str  # "module:function": make_model(width, vocab_size, **arch, **hparams) -> nn.Module
    hparams: tuple[str, ...]  # the space's hparams the factory takes (all but lr)
    optimizer: Literal["adamw", "sgd"] = "adamw"  # mup.MuAdamW, or mup.MuSGD (momentum: train.betas[0])
    init: str | None = "mup_init"  # the model's method called after set_base_shapes (absent or None: none)


def from_mup(name: str, factory: str, arch: type[BaseModel], space: type[Space], *, objective: Objective = "clm",
             optimizer: Literal["adamw", "sgd"] = "adamw", init: str | None = "mup_init",
             coord_hp: dict[str, Any] | None = None, param_count: Callable[..., int] | None = None,
             forward_flops: Callable[..., dict[str, float]] | None = None, adam_eps: float = 1e-8) -> Family:
    """The `Family` of a model built with mup (module docstring). Its config is `arch` plus `ModelSize` plus one
    float field per hparam of `space` but lr (the space's default as the field's); `coord_hp` is the coordinate
    check's small arch; without `param_count` and `forward_flops` it cannot join a compare study; `adam_eps`: its
    MuAdamW's ε when `train.adam_eps` is null."""
    hparams = tuple(h for h in space.HPARAMS if h != "lr")
    centre = space()
    fields: dict[str, Any] = {
        h: (float, Field(getattr(centre, h).default, description=space.model_fields[h].description)) for h in hparams}
    config: type[BaseModel] = create_model(f"{arch.__name__}Config", __base__=(arch, ModelSize),
                                           __module__=arch.__module__, **fields)
    recipe = MupRecipe(factory, hparams, optimizer, init)
    return Family(name, arch, config, space, "workers.models.mup_model:MupModel", objective=objective,
                  readout="logits", coord_hp=dict(coord_hp or {}), param_count=param_count,
                  forward_flops=forward_flops, mup=recipe, adam_eps=adam_eps)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add `family` to the registry (a name registered again is replaced: a reloaded module re-registers)."""
    FAMILIES[family.name] = family
    return family


def family_names() -> list[str]:
    """The registered families, in registration order."""
    if DEFERRED:
        _load_deferred()
    return list(FAMILIES)


def get_family(name: str) -> Family:
    """The family registered as `name`; a `ValueError` listing the registered ones if none is (or, for a plugin's
    family that failed to load, naming its distribution)."""
    if name not in FAMILIES and DEFERRED:
        _load_deferred()
    if name not in FAMILIES:
        if name in BROKEN:
            raise ValueError(f"model family {name!r} comes from the plugin distribution {BROKEN[name]}, which failed "
                             f"to load (the warning logged when ptctl started says why): fix or reinstall it, or "
                             f"choose one of {family_names()}")
        from studies.words import did_you_mean

        hint = did_you_mean(str(name), family_names())
        raise ValueError(f"unknown model family {name!r}: choose one of {family_names()}" + (f" ({hint})" * bool(hint)))
    return FAMILIES[name]


# ----------------------------------------------------------------------------- plugins
PLUGINS: dict[str, str] = {}  # a plugin's family name -> its distribution ("name version")
BROKEN: dict[str, str] = {}  # the entry point name of a plugin skipped -> its distribution
DEFERRED: list[EntryPoint] = []  # plugins whose module was mid-import when `studies` loaded the others
_loaded = False


def load_plugins() -> None:
    """Register the families of the installed plugins (module docstring), once per process: `studies` calls it
    after registering the built-ins."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    found = entry_points(group=ENTRY_POINT_GROUP)
    for ep in sorted(found, key=lambda e: (e.name, _distribution(e))):
        module = sys.modules.get(ep.module)
        if module is not None and getattr(module.__spec__, "_initializing", False):
            DEFERRED.append(ep)  # its module is being imported and is what imported studies: its family comes later
            continue
        _register_or_warn(ep)


def _register_or_warn(ep: EntryPoint) -> None:
    problem = _load(ep)
    if problem is not None:
        BROKEN.setdefault(ep.name, _distribution(ep))
        log.warning("%s", problem)


def _load_deferred() -> None:
    """Register the plugins whose own import had started first, once their modules have finished importing."""
    for ep in list(DEFERRED):
        module = sys.modules.get(ep.module)
        if module is None or not getattr(module.__spec__, "_initializing", False):
            DEFERRED.remove(ep)
            _register_or_warn(ep)


def _distribution(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "(unknown distribution)"


def _load(ep: EntryPoint) -> str | None:
    """Register the family of entry point `ep`; why it was skipped (None: registered)."""
    dist = _distribution(ep)
    uninstall = f"pip uninstall {dist.split()[0]}"
    where = f"ptctl plugin {ep.name!r} (entry point {ep.value!r} in group {ENTRY_POINT_GROUP!r} of distribution {dist})"
    before = dict(FAMILIES)
    try:
        obj = ep.load()
        family = obj() if callable(obj) and not isinstance(obj, (Family, type)) else obj
    except Exception as exc:  # a plugin's bug must not take the other families down
        return (f"{where} was skipped: loading it raised {type(exc).__name__}: {exc}. Fix the plugin (its module and "
                f"what it imports must import cleanly), or remove it: {uninstall}")
    finally:  # what the module registered itself is undone: the entry point's object is its family
        FAMILIES.clear()
        FAMILIES.update(before)
    if not isinstance(family, Family):
        what = f"the class {family.__name__}" if isinstance(family, type) else f"a {type(family).__name__}"
        return (f"{where} was skipped: it gave {what}, not a studies.family.Family. Point "
                "the entry point at a Family (e.g. `FAMILY = Family(name=..., arch=..., config=..., space=..., "
                f"model='module:Class')`) or at a function of no arguments returning one; or remove it: {uninstall}")
    problem = _malformed(family)
    if problem is not None:
        return f"{where} was skipped: {problem}; or remove it: {uninstall}"
    if family.name != ep.name:
        return (f"{where} was skipped: its family is named {family.name!r}, not {ep.name!r}. Name the entry point "
                f"after its family: {family.name} = \"{ep.value}\"")
    if family.name in FAMILIES:
        owner = f"the plugin distribution {PLUGINS[family.name]}" if family.name in PLUGINS else "a built-in family"
        return (f"{where} was skipped: family {family.name!r} is already {owner}'s, and a plugin may not replace a "
                f"registered family. Rename the plugin's family (and its entry point), or remove it: {uninstall}")
    register(family)
    PLUGINS[family.name] = dist
    return None


def _malformed(family: Family) -> str | None:
    """What is wrong with a plugin's `Family`, with the fix (None: nothing found)."""
    if not NAME.fullmatch(family.name):
        return f"its name {family.name!r} is not a plain name: use letters, digits, '_', '.' and '-'"
    if not (isinstance(family.arch, type) and issubclass(family.arch, BaseModel)
            and callable(getattr(family.arch, "width_steps", None))):
        return "Family.arch must be a pydantic model class with width_steps(base_width): subclass studies.arch.Arch"
    if not (isinstance(family.config, type) and issubclass(family.config, family.arch)
            and issubclass(family.config, ModelSize)):
        return ("Family.config must be a class of its arch and studies.arch.ModelSize, e.g. "
                "class MyConfig(MyArch, ModelSize) with the hparams as fields")
    if not (isinstance(family.space, type) and issubclass(family.space, Space)):
        return "Family.space must be a studies.space.Space subclass (its HPARAMS and a Range per hparam)"
    if not (isinstance(family.model, type) or (isinstance(family.model, str) and ":" in family.model)):
        return "Family.model must be the nn.Module's \"module:Class\" path (or the class itself)"
    context, fields = getattr(family.arch, "context_field", None), list(family.arch.model_fields)
    if context not in (None, ANY_LENGTH, *fields):
        return (f"Arch.context_field names {context!r}, which is not a field of its arch {fields}: name the field "
                "holding the longest sequence its model takes, or set it to studies.arch.ANY_LENGTH")
    if family.batchable is not None and not set(family.batchable) <= set(family.space.HPARAMS):
        unknown = sorted(set(family.batchable) - set(family.space.HPARAMS))
        return f"Family.batchable names {unknown}, which are not hparams of its space {list(family.space.HPARAMS)}"
    if family.objective not in get_args(Objective):
        return f"Family.objective must be one of {list(get_args(Objective))}, not {family.objective!r}"
    if not (isinstance(family.adam_eps, float) and 0 < family.adam_eps < 1):
        return f"Family.adam_eps must be a float in (0, 1), e.g. 1e-8, not {family.adam_eps!r}"
    return None
