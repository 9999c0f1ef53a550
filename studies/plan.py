"""Phase plans: which trials each phase runs, as plain data (no torch, no Ray).

A planned trial is a dict with `trial_key` (stable across restarts: the MLflow run and the trial
table row are keyed by it), `phase`, `width`, `seed`, `hparams` (all seven), `is_centre` and,
for validate, `parametrization`. The engine turns each into a `TrialConfig` with
`StudySpec.trial_config`.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd

from analysis import HPARAMS
from analysis.table import judged_loss, phase_rows
from studies.spec import StudySpec


def _trial(phase: str, key: str, width: int, seed: int, hparams: dict[str, float], **extra: Any) -> dict:
    return {"trial_key": f"{phase}-{key}", "phase": phase, "width": width, "seed": seed,
            "hparams": dict(hparams), "is_centre": False, **extra}


def best_hparams(spec: StudySpec, table: pd.DataFrame) -> dict[str, float]:
    """The tune phase's winner: the lowest eval loss among trials that ran their full budget
    (ASHA-stopped and diverged trials lose); frozen hparams keep their defaults."""
    rows = phase_rows(table, "tune")
    finished = rows[rows["status"] == "completed"]
    if finished.empty:
        raise ValueError("no tune trial completed its budget: lower space.lr's range, raise tune.num_trials "
                         "or check the trial errors in the trial table")
    best = finished.loc[judged_loss(finished).idxmin()]
    return spec.space.complete({h: float(best[h]) for h in spec.space.searched()})


def transfer_trials(spec: StudySpec, hparams: dict[str, float]) -> list[dict]:
    """The winner, unchanged, at every transfer width and seed."""
    return [_trial("transfer", f"w{w}-s{s}", w, s, hparams)
            for w in spec.transfer.widths for s in range(spec.transfer.seeds)]


def verify_trials(spec: StudySpec, centre: dict[str, float]) -> list[dict]:
    """The centre with `centre_seeds` seeds, then N samples around it at the verify width.

    Each searched hparam is drawn independently and uniformly in [(1-δ)x, (1+δ)x] (`sampling: log`:
    uniformly in log space over the same interval); frozen hparams stay at the centre. Samples
    train with `verify.seed`, the centre's first seed, so they differ from it by hparams alone.
    The draw is seeded by `verify.seed`: a restarted phase plans the same samples.
    """
    v = spec.verify
    if v is None:
        raise ValueError("this study has no verify section: add verify: {} to the spec")
    width, delta = spec.verify_width(), v.delta
    trials = [_trial("verify", f"centre-s{s}", width, v.seed + s, centre, is_centre=True)
              for s in range(v.centre_seeds)]
    rng = random.Random(v.seed)
    searched = [h for h in HPARAMS if h in spec.space.searched()]
    for i in range(v.resolved_n_samples()):
        sample = dict(centre)
        for h in searched:
            lo, hi = (1 - delta) * centre[h], (1 + delta) * centre[h]
            sample[h] = math.exp(rng.uniform(math.log(lo), math.log(hi))) if v.sampling == "log" \
                else rng.uniform(lo, hi)
        trials.append(_trial("verify", f"sample{i:03d}", width, v.seed, sample))
    return trials


def validate_trials(spec: StudySpec, centre: dict[str, float]) -> list[dict]:
    """The lr sweep: every (parametrization, width, lr, seed), other hparams at the centre."""
    v = spec.validate_
    if v is None:
        raise ValueError("this study has no validate section: add one with widths and lrs to the spec")
    return [_trial("validate", f"{p}-w{w}-lr{lr:.3g}-s{s}", w, s, {**centre, "lr": lr}, parametrization=p)
            for p in v.parametrizations for w in v.widths for lr in v.lrs for s in range(v.seeds)]

