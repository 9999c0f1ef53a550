"""Batched trials, planned: which of a grid phase's trials train together as one batched model (`workers.batched`).

Trials may share a batch when their trial configs are equal but for the hparams their family declares batchable
(`Family.batchable`, `member_key`; a family that declares none trains each trial alone): the same width, steps,
seed (so the same init draw and data order), schedule and data. A phase's planned trials are grouped by that key
in plan order and each group is cut into batches of at most K members, as even as they come (59 trials at K = 30:
30 and 29). The grouping is a pure function of the plan and K, so a restored phase re-forms the same batches.

K is `resources.batch_members`: an integer (1: every trial alone, as before batching), or "auto"
(`auto_members`): on a GPU, as many members as the device's memory holds (`member_bytes`: the parameters with
their gradients and AdamW moments, and the activations kept for backward, from the shapes `studies.budget`
counts), spread so that every trial slot of the cluster gets a batch; on CPU, 1 — measured on 2 CPU threads,
batching PT at widths 32–128 does not speed a trial's arithmetic up (`benchmarks/bench_batched.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from studies.budget import forward_flops, param_count
from studies.family import get_family
from studies.plan import PlannedTrial
from studies.spec import StudySpec

MAX_MEMBERS = 64  # a cap on auto's K: past it a batch's step is as long as K solo steps anyway
MEMORY_SHARE = 0.5  # of a worker's memory that auto's batches may fill (the rest: the data, the process, slack)


def member_key(config: dict[str, Any]) -> str:
    """What trials sharing a batch must have in common: their trial config but the family's batchable hparams."""
    hparams = set(get_family(config.get("model", "pt")).batchable or ())
    model_hp = {k: v for k, v in (config.get("model_hp") or {}).items() if k not in hparams}
    rest = {k: v for k, v in config.items() if k != "model_hp" and k not in hparams}
    return repr(sorted({**rest, "model_hp": sorted(model_hp.items())}.items()))


def solo_note(spec: StudySpec) -> str | None:
    """That the study's family trains each trial alone though `resources.batch_members` would batch them, and why;
    one line for the plan, the start of `ptctl study run` and the report (None: it batches, or K is 1)."""
    family = get_family(spec.model.family)
    if family.batchable is not None or spec.resources.batch_members == 1:
        return None
    if family.mup is not None:
        optimiser = "MuSGD" if family.mup.optimizer == "sgd" else "MuAdamW"
        why = f"its model brings its own optimiser (mup's {optimiser}), which a batch cannot stack"
    else:
        why = "it declares no batchable hparams (Family.batchable)"
    return f"family {family.name!r} trains each trial alone: {why}"


def batches(spec: StudySpec, trials: Sequence[PlannedTrial], k: int) -> list[list[PlannedTrial]]:
    """The planned trials as batches of at most `k` members each (module docstring); `k` = 1: one per trial, as
    always for a family that declares no batchable hparams (`solo_note`; a `from_mup` family: mup reads a width from
    each parameter, which a stacked one does not carry)."""
    if get_family(spec.model.family).batchable is None:
        k = 1
    groups: dict[str, list[PlannedTrial]] = {}
    for trial in trials:
        groups.setdefault(member_key(trial.trial_config(spec)), []).append(trial)
    out: list[list[PlannedTrial]] = []
    for group in groups.values():
        n = math.ceil(len(group) / max(k, 1))
        size, extra = divmod(len(group), n)
        start = 0
        for i in range(n):
            end = start + size + (i < extra)
            out.append(group[start:end])
            start = end
    return out


def member_bytes(spec: StudySpec, width: int, batch_size: int | None = None) -> float | None:
    """One member's training memory in fp32 at `width`: parameters, gradients and AdamW's two moments (4 ×
    params), and the activations kept for backward, taken as every matmul's output (forward FLOPs / 2 / width
    per sequence) times 4 for the elementwise intermediates beside them, for `batch_size` sequences (None:
    train.batch_size). None: the family has no counts."""
    parts = _member_parts(spec, width)
    return None if parts is None else parts[0] + (batch_size or spec.train.batch_size) * parts[1]


def _member_parts(spec: StudySpec, width: int) -> tuple[float, float] | None:
    """`member_bytes`' two terms: the weights' bytes, and the activations' bytes per sequence."""
    m, d = spec.model, spec.data
    try:
        params = param_count(m.family, m.arch, width, d.vocab_size, spec.tune.base_width)
        flops = sum(forward_flops(m.family, m.arch, width, d.vocab_size, d.seq_len, d.seq_len,
                                  spec.tune.base_width).values())
    except ValueError:
        return None
    return 4.0 * 4 * params, 4.0 * 4 * flops / (2 * width)


def auto_members(spec: StudySpec, trials: Sequence[PlannedTrial], *, slots: int, memory_bytes: float | None,
                 gpu: bool) -> int:
    """K for `resources.batch_members` (module docstring): the integer when one is set; "auto": 1 on CPU, else the
    members a worker's memory holds, no more than fill each of `slots` concurrent batches."""
    chosen = spec.resources.batch_members
    if chosen != "auto":
        return int(chosen)
    if not gpu or not trials:
        return 1
    spread = math.ceil(len(trials) / max(slots, 1))
    if memory_bytes is None:
        return min(spread, MAX_MEMBERS)
    batch = max(t.batch_size(spec) for t in trials)  # a batch sweep's largest
    per_member = member_bytes(spec, max(t.width for t in trials), batch)
    fits = MAX_MEMBERS if per_member is None else int(MEMORY_SHARE * memory_bytes // per_member)
    return max(1, min(spread, fits, MAX_MEMBERS))


def memory_problem(spec: StudySpec, memory_bytes: float, where: str, gpu: bool) -> tuple[str, str] | None:
    """(field, message leading with the field) when the study's largest trial would need more than `memory_bytes`
    (`where`: the machine it was read from) in training, by `member_bytes`' arithmetic; None when it fits, when
    its trials train on a GPU (`gpu`: the cluster has one, or the spec asks for GPUs; whose memory the caller does
    not know) or when the family has no counts.
    The field named is the one that dominates: data.seq_len when the activations do, else the widest width."""
    res = spec.resources
    asks = res.gpus_per_trial > 0 or bool(res.transfer_gpus)  # its trials wait for GPUs: they train there
    if spec.train.device == "cuda" or (spec.train.device == "auto" and (gpu or asks)):
        return None
    v = spec.validate_
    widths = [("tune.base_width", spec.tune.base_width)]
    widths += [(f"transfer.widths[{i}]", w) for i, w in enumerate(spec.transfer.widths if spec.transfer else [])]
    widths += [("verify.width", spec.verify.width)] if spec.verify is not None and spec.verify.width else []
    widths += [(f"validate.widths[{i}]", w) for i, w in enumerate(v.widths if v is not None else [])]
    field, width = max(widths, key=lambda fw: fw[1])
    batch = max([spec.batch_for("tune"), spec.train.batch_size, *((v.batch_sizes or []) if v is not None else [])])
    parts = _member_parts(spec, width)
    if parts is None:
        return None
    weights, activations = parts[0], batch * parts[1]
    need, value = weights + activations, width
    if need <= memory_bytes:
        return None
    if activations > weights:  # the activations dominate
        field, value = "data.seq_len", spec.data.seq_len
    gib = 2.0**30
    return field, (f"{field}={value}: a trial at width {width} on {batch} sequences of {spec.data.seq_len} tokens "
                   f"needs about {need / gib:.1f} GiB to train (parameters, gradients, AdamW's moments and the "
                   f"activations kept for backward) but {where} has {memory_bytes / gib:.1f} GiB: lower "
                   "data.seq_len, the batch size or the widths, or train on a GPU (train.device)")
