"""Phase plans: which trials each phase runs, as plain data (no torch, no Ray).

A planned trial is a frozen `PlannedTrial`: `trial_key` (stable across restarts: the MLflow run and the
trial table row are keyed by it), `phase`, `width`, `seed`, `hparams` (all of the family's), `is_centre`,
for validate and compare its `parametrization`, for validate the `swept` hparam, and for compare its family,
budget, role, stage and FLOPs with its own `config` (its family differs from the spec's). A runner turns each
into a trial config with `PlannedTrial.trial_config`; Ray Tune carries it as `as_dict()` in the trial's config.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pandas as pd

from analysis.table import TrialStatus, judged_loss, phase_rows
from studies.arch import ModelSpec, rebase
from studies.budget import train_flops, width_for_budget
from studies.spec import StudySpec, required

PLANNED_COLUMNS = ("family", "budget", "role", "tuned_at", "train_flops",  # compare trials' extra table columns
                   "swept")  # validate trials': the hparam their sweep varies


@dataclass(frozen=True)
class PlannedTrial:
    """One trial a phase runs (a TPE suggestion in tune, planned up front in the other phases)."""

    trial_key: str
    phase: str
    width: int
    seed: int
    hparams: Mapping[str, float]
    is_centre: bool = False
    parametrization: str | None = None  # None: the spec's
    swept: str | None = None  # validate: the hparam its sweep varies
    family: str | None = None  # compare: the family, its budget, role, tune stage and training FLOPs
    budget: float | None = None
    role: str | None = None
    tuned_at: str | None = None
    train_flops: float | None = None
    config: Mapping[str, Any] | None = field(default=None, repr=False)  # compare: the family's own trial config

    @classmethod
    def for_tune(cls, spec: StudySpec, trial_id: str, suggested: Mapping[str, float]) -> PlannedTrial:
        """A tune trial: the searcher's suggestion (frozen hparams at their defaults) at the base width."""
        hparams = spec.space.complete(dict(suggested))
        return cls(f"tune-{trial_id}", "tune", spec.tune.base_width, spec.tune.seed, hparams)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannedTrial:
        """The inverse of `as_dict` (also what Ray Tune restores from an experiment's trial configs)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"a planned trial has unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, without the fields that are not set (Ray Tune's trial config)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def trial_config(self, spec: StudySpec) -> dict[str, Any]:
        """The trial config dict `workers.train` takes: a compare trial's own, else the spec's at this trial."""
        if self.config is not None:
            return dict(self.config)
        return spec.trial_config(self.width, dict(self.hparams), self.seed, spec.steps_for(self.phase),
                                 self.parametrization)

    def columns(self, spec: StudySpec) -> dict[str, Any]:
        """The trial table's planned columns (`analysis/__init__.py`): identity, parametrization, validate's and
        compare's extras, and the hparams."""
        return {"trial_id": self.trial_key, "phase": self.phase, "width": self.width, "seed": self.seed,
                "is_centre": self.is_centre, "parametrization": self.parametrization or spec.model.parametrization,
                **{k: getattr(self, k) for k in PLANNED_COLUMNS if getattr(self, k) is not None}, **self.hparams}


def _trial(phase: str, key: str, width: int, seed: int, hparams: Mapping[str, float], **extra: Any) -> PlannedTrial:
    return PlannedTrial(f"{phase}-{key}", phase, width, seed, dict(hparams), **extra)


def best_hparams(spec: StudySpec, table: pd.DataFrame) -> dict[str, float]:
    """The tune phase's winner: the lowest eval loss among trials that ran their full budget
    (ASHA-stopped and diverged trials lose); frozen hparams keep their defaults."""
    rows = phase_rows(table, "tune")
    finished = rows[rows["status"] == TrialStatus.COMPLETED]
    if finished.empty:
        raise ValueError("no tune trial completed its budget: lower space.lr's range, raise tune.num_trials "
                         "or check the trial errors in the trial table")
    best = finished.loc[judged_loss(finished).idxmin()]
    return spec.space.complete({h: float(best[h]) for h in spec.space.searched()})


def transfer_trials(spec: StudySpec, hparams: dict[str, float]) -> list[PlannedTrial]:
    """The winner, unchanged, at every transfer width and seed."""
    t = required(spec.transfer, "transfer")
    return [_trial("transfer", f"w{w}-s{s}", w, s, hparams) for w in t.widths for s in range(t.seeds)]


def verify_trials(spec: StudySpec, centre: dict[str, float], skip_centre_seeds: Collection[int] = ()
                  ) -> list[PlannedTrial]:
    """The centre with `centre_seeds` seeds (but `skip_centre_seeds`: runs reused from transfer), then N samples
    around it at the verify width.

    Each searched hparam is drawn independently and uniformly in [(1-δ)x, (1+δ)x] (`sampling: log`:
    uniformly in log space over the same interval); frozen hparams stay at the centre. Samples
    train with `verify.seed`, the centre's first seed, so they differ from it by hparams alone.
    The draw is seeded by `verify.seed`: a restarted phase plans the same samples.
    """
    v = required(spec.verify, "verify")
    width, delta = spec.verify_width(), v.delta
    trials = [_trial("verify", f"centre-s{s}", width, v.seed + s, centre, is_centre=True)
              for s in range(v.centre_seeds) if v.seed + s not in skip_centre_seeds]
    rng = random.Random(v.seed)
    searched = list(spec.space.searched())  # in the family's hparam order
    for i in range(v.resolved_n_samples()):
        sample = dict(centre)
        for h in searched:
            lo, hi = (1 - delta) * centre[h], (1 + delta) * centre[h]
            sample[h] = math.exp(rng.uniform(math.log(lo), math.log(hi))) if v.sampling == "log" \
                else rng.uniform(lo, hi)
        trials.append(_trial("verify", f"sample{i:03d}", width, v.seed, sample))
    return trials


def reused_centre_seeds(spec: StudySpec) -> list[int]:
    """The verify centre's seeds whose run is a transfer run already: same width, seed and steps (and the same
    centre hparams, the tune winner, by construction). The verify phase copies those rows instead of training."""
    v, t = spec.verify, spec.transfer
    if v is None or t is None or spec.verify_width() not in t.widths or spec.steps_for("verify") != spec.steps_for(
            "transfer"):
        return []
    return [v.seed + s for s in range(v.centre_seeds) if v.seed + s < t.seeds]


def with_reused_centre(spec: StudySpec, verify: pd.DataFrame, transfer: pd.DataFrame) -> pd.DataFrame:
    """The verify table with the reused centre runs (`reused_centre_seeds`) copied in from the transfer table as
    `verify-centre-s<k>` rows, is_centre True, their `message` naming the transfer run."""
    width, seeds = spec.verify_width(), reused_centre_seeds(spec)
    rows = transfer[(transfer["width"] == width) & transfer["seed"].isin(seeds)].copy()
    if rows.empty or spec.verify is None:  # no reused seeds without a verify section
        return verify
    source = rows["trial_id"].astype(str)
    rows["phase"], rows["is_centre"] = "verify", True
    rows["trial_id"] = [f"verify-centre-s{s - spec.verify.seed}" for s in rows["seed"]]
    rows["message"] = "reused from " + source
    return pd.concat([rows, verify], ignore_index=True).sort_values("trial_id", kind="stable", ignore_index=True)


def validate_trials(spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
    """The sweeps: lr's, then each of `validate.hparams`: every (parametrization, width, value, seed) of the swept
    hparam, the other hparams at the centre."""
    v = required(spec.validate_, "validate")
    return [_trial("validate", f"{p}-w{w}-{h}{x:.3g}-s{s}", w, s, {**centre, h: x}, parametrization=p, swept=h)
            for h, values in v.sweeps().items()
            for p in v.parametrizations for w in v.widths for x in values for s in range(v.seeds)]



# ----------------------------------------------------------------------------------------------- compare
def compare_widths(spec: StudySpec, vocab_size: int) -> dict[str, dict[str, Any]]:
    """Per family: its role, the solved width at each budget, and (the study's own model) the proxy width.

    `{family: {"role": "transferred" | "tuned", "widths": [w per budget], "proxy_width": w0 | None}}`, the
    study's model first; widths meet each budget within compare.tolerance (else a `ValueError` naming the fix).
    """
    c = required(spec.compare, "compare")
    base = spec.tune.base_width

    def solve(model: ModelSpec, budget: float) -> int:
        return width_for_budget(model.family, model.arch, budget, vocab_size, base, c.tolerance)

    out: dict[str, dict[str, Any]] = {
        spec.model.family: {"role": "transferred", "widths": [solve(spec.model, b) for b in c.budgets],
                            "proxy_width": solve(spec.model, c.proxy())}}
    for b in c.baselines:
        out[b.model.family] = {"role": "tuned", "widths": [solve(b.model, x) for x in c.budgets], "proxy_width": None}
    return out


def compare_sub_spec(spec: StudySpec, family: str, width: int) -> StudySpec:
    """The tune-only study one compare stage runs: `family` tuned at `width`, which becomes its μP base.

    The study's own model keeps its arch, rebased to the proxy width (PT's sizes are given at the base width);
    a baseline takes its entry's model, space and num_trials. Tune trials see compare.tune_tokens, and
    `train.steps` is the final runs' (compare.tokens), so `trial_config(..., steps=None)` gives a final run.
    """
    c = required(spec.compare, "compare")
    data = spec.as_dict()
    data.update(compare=None, transfer=None, verify=None, validate=None)
    data["tune"] = {**data["tune"], "base_width": width, "steps": spec.steps_for("tune")}
    data["train"] = {**data["train"], "steps": spec.steps_for("compare")}
    if family == spec.model.family:
        arch = rebase(spec.model.arch, spec.tune.base_width, width)
        data["model"] = {**data["model"], "arch": arch.model_dump(mode="json")}
    else:
        entry = next((b for b in c.baselines if b.model.family == family), None)
        if entry is None:
            raise ValueError(f"family {family!r} is not in this compare study: choose one of "
                             f"{[spec.model.family, *(b.model.family for b in c.baselines)]}")
        data["model"] = entry.model.model_dump(mode="json")
        data["space"] = entry.space.model_dump(mode="json")
        data["tune"]["num_trials"] = entry.num_trials
    return StudySpec.model_validate(data)


def compare_stages(spec: StudySpec, vocab_size: int) -> list[dict[str, Any]]:
    """The tune stages: the study's model once at its proxy width, each baseline at every budget's width."""
    c, stages = required(spec.compare, "compare"), []
    for family, info in compare_widths(spec, vocab_size).items():
        if info["role"] == "transferred":
            points = [(c.proxy(), info["proxy_width"], "proxy")]
        else:
            points = [(budget, w, f"b{i}") for i, (budget, w) in enumerate(zip(c.budgets, info["widths"], strict=True))]
        stages += [{"name": f"{family}-{tag}", "family": family, "budget": budget, "width": width,
                    "spec": compare_sub_spec(spec, family, width)} for budget, width, tag in points]
    return stages


def compare_trials(spec: StudySpec, vocab_size: int, best: dict[str, dict[str, float]]) -> list[PlannedTrial]:
    """The final runs: every family at every budget and seed, on compare.tokens tokens.

    `best` maps stage name (`compare_stages`) → the stage's best hparams; the study's model uses its proxy
    stage's hparams at every budget (zero-shot, μP base at the proxy width), each baseline its budget's own.
    Each trial carries its full `config` (a trial config dict) and its computed `train_flops`.
    """
    c, trials = required(spec.compare, "compare"), []
    for family, info in compare_widths(spec, vocab_size).items():
        for i, (budget, width) in enumerate(zip(c.budgets, info["widths"], strict=True)):
            stage = f"{family}-proxy" if info["role"] == "transferred" else f"{family}-b{i}"
            sub = compare_sub_spec(spec, family, info["proxy_width"] if info["role"] == "transferred" else width)
            hparams = sub.space.complete(best[stage])
            steps = spec.steps_for("compare")
            flops = train_flops(family, sub.model.arch, width, vocab_size, spec.data.seq_len, spec.data.mask_rate,
                                steps * spec.train.batch_size, sub.tune.base_width)
            for seed in range(c.seeds):
                trials.append(_trial("compare", f"{family}-b{i}-s{seed}", width, seed, hparams, family=family,
                                     budget=budget, role=info["role"], tuned_at=stage, train_flops=flops,
                                     parametrization=sub.model.parametrization,
                                     config=sub.trial_config(width, hparams, seed, steps)))
    return trials
