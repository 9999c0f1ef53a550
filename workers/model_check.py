"""The model contract, checked at the door: a family's model built small and run on a few tokens before any trial.

`check_model` runs before `ptctl coord-check`, `ptctl train`, a study's first trial (`check_study`: one small
shape for every spec) and `POST /studies` and `POST /plans` (`check_study` in a child process under a memory and a
time cap: `workers.door`). Each rule it checks is one a trial relies on; a broken one is a `ContractError`:
one line naming the family, the package that provides it, what was expected, what was seen and the fix.
docs/plugins.md states the contract these checks enforce.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from studies.arch import context_error, width_step
from studies.family import PLUGINS, Family
from studies.members import memory_problem
from studies.spec import StudySpec
from workers.attention import traced_attention
from workers.errors import ConfigError, PtctlError, one_line
from workers.models import build_model, family
from workers.models.contract import LanguageModel
from workers.paths import data_dir
from workers.quiet import quiet

VOCAB = 61  # the check's vocabulary: any size a model takes; small keeps the readout cheap
BATCH = 3
DOOR_SEQ = 16  # a study's check runs on this many tokens, whatever its data.seq_len (`check_study`)
DOOR_WIDTH = 32  # ... at the smallest width from here that its arch builds at (`door_width`)
TOL = 1e-4  # relative: what a change elsewhere may move an output that must not depend on it (float32 noise)


class ContractError(ConfigError):
    """A family's model breaks ptctl's model contract (docs/plugins.md)."""


@dataclass(frozen=True)
class Findings:
    """What the check learnt about a model that keeps its contract."""

    log_probs: bool  # its output is already normalised (log-sum-exp 0): the coordinate check judges the readout's


def provider(name: str) -> str:
    """Who provides family `name`: ptctl itself, a plugin distribution, or a module's package."""
    if name in PLUGINS:
        return f"plugin distribution {PLUGINS[name]}"
    module = _module(family(name))
    top = module.split(".")[0]
    if top == "workers":
        return "built into ptctl"
    dists = packages_distributions().get(top)
    return f"package {top} (distribution {dists[0]})" if dists else f"module {module}"


def _module(entry: Family) -> str:
    if entry.mup is not None:
        return entry.mup.factory.partition(":")[0]
    return entry.model.partition(":")[0] if isinstance(entry.model, str) else entry.model.__module__


def builtin(name: str) -> bool:
    return name not in PLUGINS and _module(family(name)).startswith("workers.")


def _error(name: str, what: str, expected: str, saw: str, fix: str) -> ContractError:
    return ContractError(f"model family {name!r} ({provider(name)}) {what}: expected {expected}; saw {saw}. "
                         f"Fix: {fix}")


@contextmanager
def plugin_errors(name: str, doing: str) -> Iterator[None]:
    """An exception raised in a non-built-in family's own code while `doing` becomes one `ContractError` line
    naming the family and its package; ptctl's own errors and built-in families' pass through as they are."""
    try:
        yield
    except PtctlError:
        raise
    except Exception as exc:
        if builtin(name) or not _raised_in(exc, name):
            raise
        raise ContractError(f"model family {name!r} ({provider(name)}) raised {one_line(exc)} while {doing}. Fix "
                            "the model's code (the error is the model's own, not ptctl's)") from exc


def _raised_in(exc: BaseException, name: str) -> bool:
    """Whether a frame of `exc`'s traceback lies in the family's own package."""
    top = importlib.import_module(_module(family(name)).split(".")[0])
    root = Path(top.__file__ or "").parent if hasattr(top, "__path__") else Path(top.__file__ or "")  # a module: itself
    return any(Path(frame.filename).is_relative_to(root) for frame in traceback.extract_tb(exc.__traceback__))


def check_model(name: str, model_hp: dict[str, Any], seq_len: int) -> Findings:
    """Build family `name` from `model_hp` (its config's kwargs but vocab_size) and check its forward on
    (BATCH, seq_len) token ids (module docstring); under μP, also at twice the width (`mup_checks`)."""
    with torch.random.fork_rng(devices=[]), quiet(data_dir() / "logs" / "model_check.log"):  # the model's prints
        torch.manual_seed(0)
        model = _build(name, model_hp)
        cfg = getattr(model, "cfg", None)  # its declared context, before a forward longer than it
        if isinstance(cfg, BaseModel) and (problem := context_error(cfg, seq_len)):
            raise ConfigError(problem)
        problems = _mup_problems({model_hp["width"]: model})  # set_base_shapes forgotten: mup's layers cannot run
        if problems:
            raise ContractError(f"model family {name!r} ({provider(name)}) is not μP as built: " + "; ".join(problems))
        findings = _check_forward(name, model, seq_len)
        if type(model).make_optimizer is LanguageModel.make_optimizer:  # ptctl's AdamW over the model's groups
            _check_groups(name, model)
        if model_hp.get("parametrization") == "mup":
            wide = _build(name, {**model_hp, "width": 2 * model_hp["width"]})
            mup_checks(name, {model_hp["width"]: model, 2 * model_hp["width"]: wide})
    return findings


def door_width(spec: StudySpec) -> int:
    """The narrower of the door's two widths: the smallest width from `DOOR_WIDTH` up that the arch builds at
    (a multiple of its width step), or the base width when that is smaller."""
    step = width_step(spec.model.arch, spec.tune.base_width)
    return min(spec.tune.base_width, step * math.ceil(DOOR_WIDTH / step))


def check_study(spec: StudySpec) -> None:
    """`check_model` for the study's family under each parametrization it trains, at one small shape whatever the
    spec's sizes: `door_width` (and twice it under μP) on `DOOR_SEQ` tokens (fewer if data.seq_len is shorter), once
    per process for each (family, arch, parametrization). What the small shape cannot show is arithmetic: the
    context length is the spec's check against the arch's `context_field`, a trial's memory `studies.members`'."""
    for shape in door_shapes(spec):
        _checked(*shape)


def door_shapes(spec: StudySpec) -> list[tuple[str, str, int]]:
    """What `check_study` checks, per parametrization the study trains: (family, model config as JSON, tokens);
    also the key of `workers.door.Door`'s answers."""
    params = {spec.model.parametrization, *(spec.validate_.parametrizations if spec.validate_ else ())}
    width, seq_len = door_width(spec), min(spec.data.seq_len, DOOR_SEQ)
    return [(spec.model.family, json.dumps(spec.model_hp(width, {}, p), sort_keys=True, default=str), seq_len)
            for p in sorted(params)]


def check_memory(spec: StudySpec) -> None:
    """A `ConfigError` when the study's largest trial cannot fit the memory its trials get (`studies.members`'
    arithmetic against `workers.probe.trial_memory`): nothing is built."""
    from workers.probe import trial_memory

    problem = memory_problem(spec, *trial_memory())
    if problem is not None:
        raise ConfigError(problem[1])


@functools.cache
def _checked(name: str, model_hp: str, seq_len: int) -> Findings:
    return check_model(name, json.loads(model_hp), seq_len)


def _build(name: str, model_hp: dict[str, Any]) -> LanguageModel:
    try:
        return build_model(name, vocab_size=VOCAB, **model_hp).eval()
    except PtctlError:
        raise
    except Exception as exc:
        if builtin(name):
            raise
        raise _error(name, "could not be built", f"a model built from {model_hp}", one_line(exc),
                     "choose arch values the model accepts (its error says which)") from exc


def _run(name: str, model: LanguageModel, ids: torch.Tensor, **kw: Any) -> Any:
    with torch.no_grad(), plugin_errors(name, f"running its forward on token ids of shape {tuple(ids.shape)}"):
        try:
            return model(ids, torch.ones_like(ids, dtype=torch.bool), **kw)
        except TypeError as exc:
            if "argument" not in str(exc):
                raise
            raise _error(name, "has a forward ptctl cannot call", "forward(input_ids, attention_mask, trace=None, "
                         "select=None)", one_line(exc), "give the model that signature (docs/plugins.md)") from exc


def _check_forward(name: str, model: LanguageModel, seq_len: int) -> Findings:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(VOCAB, (BATCH, seq_len), generator=g)
    try:
        out = _run(name, model, ids)
    except ContractError as first:
        short = min(8, seq_len - 1)
        if short < 1:
            raise
        try:
            _run(name, model, ids[:, :short])
        except ContractError:
            raise first from None
        raise _error(name, "does not fit the data", f"a context of at least data.seq_len={seq_len} tokens",
                     f"its forward runs on {short} tokens and fails on {seq_len}",
                     "raise the arch's context length (e.g. block_size) or lower data.seq_len") from None
    _check_output(name, out, (BATCH, seq_len, VOCAB))
    with _varying(model):  # what the checks below compare must vary: a zero-initialised readout hides nothing
        varied = _run(name, model, ids)
        _check_varies(name, varied)
        _check_batch(name, model, ids, varied)
        if family(name).objective == "clm":
            _check_causal(name, model, ids, varied)
        _check_select(name, model, ids, varied)
    _check_trace(name, model, ids)
    return Findings(log_probs=log_probs(out))


@contextmanager
def _varying(model: LanguageModel) -> Iterator[None]:
    """The model with its all-zero matrices (μP's zero readout, a zero query) drawn at random, restored after:
    with them at zero the logits are constants, and every comparison of them would pass."""
    zeros = [p for p in model.parameters() if p.dim() >= 2 and not p.detach().any()]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in zeros:
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) / math.sqrt(p.shape[-1]))
    try:
        yield
    finally:
        with torch.no_grad():
            for p in zeros:
                p.zero_()


def _check_varies(name: str, out: torch.Tensor) -> None:
    flat = out.reshape(-1, out.shape[-1])
    if bool((flat - flat[0]).abs().max() <= TOL * (1 + flat.abs().max())):
        raise _error(name, "ignores its input", "logits that depend on the tokens (with its all-zero matrices "
                     "drawn at random, as the door draws them)", "the same logits at every position of every "
                     "sequence", "check that the forward uses input_ids")


def _check_output(name: str, out: Any, shape: tuple[int, int, int]) -> None:
    expected = f"float logits of shape (batch, seq, vocab) = {shape}"
    if not isinstance(out, torch.Tensor):
        parts = ", ".join(_describe(o) for o in out) if isinstance(out, (tuple, list)) else ""
        raise _error(name, "returns no tensor from its forward", expected, f"a {type(out).__name__}"
                     + (f" of ({parts})" if parts else ""), "return the logits alone (a wrapper whose forward "
                     "returns model(ids)[0] does it)")
    if not out.is_floating_point() or tuple(out.shape) != shape:
        raise _error(name, "returns the wrong output", expected, _describe(out),
                     "map token ids (batch, seq) to logits (batch, seq, vocab); a model that takes (seq, batch) "
                     "needs a wrapper that transposes in and out")
    if not torch.isfinite(out).all():
        raise _error(name, "returns non-finite logits at initialisation", "finite logits", "NaN or inf",
                     "check the model's initialisation")


def _describe(x: Any) -> str:
    return f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= TOL * (1 + b.abs().max()))


def _check_batch(name: str, model: LanguageModel, ids: torch.Tensor, out: torch.Tensor) -> None:
    changed = ids.clone()
    changed[0] = (ids[0] + 1) % VOCAB
    if not _close(_run(name, model, changed)[1:], out[1:]):
        raise _error(name, "mixes the sequences of a batch", "each sequence's logits to depend on that sequence "
                     "alone", "changing sequence 0 changed the others' logits", "make the model take input_ids of "
                     "shape (batch, seq) — a model that takes (seq, batch) attends across the batch: wrap it to "
                     "transpose — and keep batch statistics (e.g. BatchNorm) out of the forward")


def _check_causal(name: str, model: LanguageModel, ids: torch.Tensor, out: torch.Tensor) -> None:
    t = ids.shape[1] // 2
    changed = ids.clone()
    changed[:, t + 1:] = (ids[:, t + 1:] + 1) % VOCAB
    if not _close(_run(name, model, changed)[:, : t + 1], out[:, : t + 1]):
        raise _error(name, "sees the future", "a causal LM's logits at position t to depend on tokens ≤ t only",
                     f"changing tokens after position {t} changed the logits up to it", "mask attention causally "
                     "(or register the family with objective='mlm' if it is a masked LM)")


def _check_select(name: str, model: LanguageModel, ids: torch.Tensor, out: torch.Tensor) -> None:
    select = torch.zeros_like(ids, dtype=torch.bool)
    select[:, ::3] = True
    got = _run(name, model, ids, select=select)
    if not isinstance(got, torch.Tensor) or got.shape != out[select].shape or not _close(got, out[select]):
        raise _error(name, "ignores `select`", f"forward(..., select=mask) to return logits[mask], shape "
                     f"{tuple(out[select].shape)}", _describe(got), "return logits[select] when select is given")


def _check_trace(name: str, model: LanguageModel, ids: torch.Tensor) -> None:
    trace: dict[str, torch.Tensor] = {}
    with traced_attention(model, trace):  # SDPA's logits too, as the coordinate check sees them
        _run(name, model, ids, trace=trace)
    readout = family(name).readout
    if readout not in trace:
        raise _error(name, "records no readout in its trace", f"the logits under Family.readout={readout!r}",
                     f"trace names {sorted(trace)[:8]}", "record the output logits as trace[Family.readout] "
                     "(or set Family.readout to the name the model records them under)")


def log_probs(out: torch.Tensor) -> bool:
    """Whether `out` is already normalised: log-sum-exp over the vocabulary ≈ 0 at every position."""
    return bool((out.float().logsumexp(-1).abs() < 1e-3).all())


def mup_checks(name: str, models: dict[int, LanguageModel]) -> None:
    """μP's rules that a model at two widths shows before training: mup's shapes and init (`mup_problems`), each
    `MuReadout`'s width_mult() growing with width, and hidden lr multipliers that shrink with it."""
    (w1, small), (w2, wide) = sorted(models.items())
    problems = _mup_problems(models)
    if problems:
        raise ContractError(f"model family {name!r} ({provider(name)}) is not μP as built: " + "; ".join(problems))
    for path, readout in small.named_modules():
        m1, m2 = _width_mult(readout), _width_mult(wide.get_submodule(path))
        if m1 is not None and m2 is not None and abs(m2 / m1 - w2 / w1) > 1e-6:
            raise _error(name, "has a readout that does not scale", f"{path or 'its'}.width_mult() to grow "
                         f"{w2 // w1}× from width {w1} to {w2}", f"{m1:g} and {m2:g}", "build the readout with "
                         "mup's MuReadout and let mup.set_base_shapes set its width (do not override width_mult)")
    if type(small).make_optimizer is LanguageModel.make_optimizer:  # ptctl's AdamW: μP lives in lr_multipliers
        before, after = small.lr_multipliers(), wide.lr_multipliers()
        if before == after:
            raise _error(name, "keeps its learning rates as width grows", "under μP a hidden group's Adam lr to "
                         f"shrink as base_width/width (lr_multipliers() at widths {w1} and {w2} to differ)",
                         f"the same multipliers {before}", "scale the hidden groups' lr multipliers by "
                         "base_width/width when parametrization is 'mup'")


def _width_mult(module: torch.nn.Module) -> float | None:
    method = getattr(module, "width_mult", None)
    return float(method()) if callable(method) else None


def _mup_problems(models: dict[int, LanguageModel]) -> list[str]:
    try:
        from workers.models.mup_model import mup_problems
    except ModuleNotFoundError:  # no mup installed: no model can use its layers
        return []
    return mup_problems(dict(models))


def _check_groups(name: str, model: LanguageModel) -> None:
    groups = getattr(model, "groups", None)
    if not isinstance(groups, dict):
        raise _error(name, "has no parameter groups", "model.groups: {group name: [parameters]}",
                     type(groups).__name__, "set self.groups in the model's __init__ (docs/plugins.md)")
    grouped = {id(p) for params in groups.values() for p in params}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in grouped]
    if missing:
        raise _error(name, "leaves parameters out of its groups", "every trainable parameter in one of "
                     f"model.groups {sorted(groups)}", f"{missing[:3]} in none", "add them to a group")
    mults = model.lr_multipliers()
    if set(groups) - set(mults):
        raise _error(name, "has groups without a learning rate", f"lr_multipliers() keys {sorted(groups)}",
                     f"{sorted(mults)}", "return a multiplier for every group")
