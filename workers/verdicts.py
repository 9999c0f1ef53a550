"""What the MLflow runs say at a glance: each phase's verdict as params, metrics, tags and a sentence.

Pure (no MLflow): the driver hands these to `workers.tracking.Tracker.log_verdict`. Every verdict is built
from a phase's result as `state.json` keeps it, so a resumed study logs the same verdicts.

| phase | params | metrics | tags |
|---|---|---|---|
| tune | `best.<hparam>`, `base_width` | `best_eval_loss`, `n_trials` | |
| transfer | `base_width`, `target_widths` | `eval_loss` with step = width (MLflow plots loss vs width) | |
| verify | `verify_width` | `upper_bound`, `n_better`, `centre_rank`, `n_samples`, `centre_loss` | `certified` |
| validate | | `<hparam>_drift.<parametrization>` (lr and each of validate.hparams) | `<hparam>_drift_passed` |

verify also logs `noise_better_expected` when the centre's seed noise is known (two or more seeds, a spread).
Each also has a sentence: the winner, the loss per width, the certificate, the drift verdict.

The study run carries all of them; its description is every sentence followed by the spec's description.
`verdict_columns` names them as the MLflow UI's runs-table columns: the experiment's saved view `verdicts`
(`workers.tracking.Tracker.save_view`) shows them, and the link `ptctl study run` prints opens it.
Trial runs are named for a reader (`tune-07 lr=4.4e-3`), and `provenance_tags` say who ran what from where.
"""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studies.spec import StudySpec


@dataclass
class Verdict:
    params: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # rows with a `step`
    tags: dict[str, Any] = field(default_factory=dict)
    sentence: str = ""

    def merge(self, other: Verdict) -> Verdict:
        return Verdict({**self.params, **other.params}, [*self.metrics, *other.metrics], {**self.tags, **other.tags},
                       " ".join(s for s in (self.sentence, other.sentence) if s))


def _lr(value: float) -> str:
    """4.4e-3 style: two significant digits, no exponent padding."""
    return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m.group(1) == '-' else ''}{m.group(2)}", f"{value:.1e}")


def phase_verdict(spec: StudySpec, phase: str, result: dict[str, Any]) -> Verdict:
    """The verdict of one finished phase from its `state.json` result ({} for phases without one)."""
    if phase == "tune":
        best = result["best_hparams"]
        shown = ", ".join(f"{h}={_lr(best[h]) if h == 'lr' else f'{best[h]:.3g}'}" for h in spec.space.searched())
        return Verdict({**{f"best.{h}": v for h, v in best.items()}, "base_width": spec.tune.base_width},
                       [{"step": 0, "best_eval_loss": result["best_eval_loss"], "n_trials": result["n_trials"]}],
                       sentence=f"Tuned at width {spec.tune.base_width} over {result['n_trials']} trials: "
                                f"{shown} (eval loss {result['best_eval_loss']:.4f}).")
    if phase == "transfer":
        assert spec.transfer is not None  # a study has a transfer phase only with a transfer section
        widths = [r for r in result["widths"] if r.get("eval_loss_mean") == r.get("eval_loss_mean")]
        losses = ", ".join(f"{r['width']}: {r['eval_loss_mean']:.4f}" for r in widths)
        return Verdict({"base_width": spec.tune.base_width, "target_widths": ",".join(str(w) for w in
                                                                                        spec.transfer.widths)},
                       [{"step": int(r["width"]), "eval_loss": r["eval_loss_mean"]} for r in widths],
                       sentence=f"Zero-shot eval loss per width: {losses}.")
    if phase == "verify":
        c = result["certificate"]
        return Verdict({"verify_width": spec.verify_width()},
                       [{"step": 0, **{k: c[k] for k in ("upper_bound", "n_better", "centre_rank", "n_samples",
                                                          "centre_loss")},
                         **({} if c.get("noise_better_expected") is None  # None: one centre seed; absent: older
                            else {"noise_better_expected": c["noise_better_expected"]})}],
                       {"certified": str(bool(c["certified"])).lower()},
                       sentence=f"Certificate: {c['verdict']}.")
    if phase == "validate":
        drifts = {"lr": result["lr_drift"], **result.get("hparam_drift", {})}
        return Verdict(metrics=[{"step": 0, **{f"{h}_drift.{p}": v for h, d in drifts.items()
                                                for p, v in d["drift"].items()}}],
                       tags={f"{h}_drift_passed": str(bool(d["passed"])).lower() for h, d in drifts.items()},
                       sentence=" ".join(f"{h} drift: {d['verdict']}." for h, d in drifts.items()))
    return Verdict()


def study_verdict(spec: StudySpec, phases: dict[str, dict[str, Any]]) -> Verdict:
    """Every finished phase's verdict on one run (the study's); the sentence is the study run's description."""
    verdict = Verdict()
    for phase in spec.phases():
        if phases.get(phase, {}).get("status") == "done":
            verdict = verdict.merge(phase_verdict(spec, phase, phases[phase]))
    return verdict


def verdict_columns(spec: StudySpec) -> list[str]:
    """The runs-table columns that show `spec`'s verdicts, as the MLflow UI names them (`metrics.`upper_bound``):
    the certificate, the winner and the widths, the loss per width, each drift, where ASHA stopped a trial, and
    each run's description (its verdict sentence)."""
    phases = spec.phases()
    metrics: list[str] = []
    params: list[str] = []
    tags: list[str] = []
    if "verify" in phases:
        tags.append("certified")
        metrics += ["upper_bound", "n_better", "centre_rank"]
    if "tune" in phases:
        params += [*(f"best.{h}" for h in spec.space.searched()), "base_width"]
        metrics.append("best_eval_loss")
    if "transfer" in phases:
        params.append("target_widths")
    metrics.append("eval_loss")  # the transfer run's loss per width; each trial's own
    if spec.validate_ is not None:
        for h in ("lr", *spec.validate_.hparams):
            metrics += [f"{h}_drift.{p}" for p in spec.validate_.parametrizations]
            tags.append(f"{h}_drift_passed")
    if "tune" in phases:
        metrics.append("steps_done")
    return [*(f"{group}.`{name}`" for group, names in (("tags", tags), ("metrics", metrics), ("params", params))
              for name in names), "attributes.`Description`"]


def trial_run_name(trial_key: str, hparams: dict[str, float], number: int | None = None) -> str:
    """`tune-07 lr=4.4e-3` for the 7th tune trial (`number`, Tune's count), else the trial key and its lr."""
    stem = f"tune-{number:02d}" if trial_key.startswith("tune-") and number is not None else trial_key
    return f"{stem} lr={_lr(hparams['lr'])}" if "lr" in hparams and "-lr" not in trial_key else stem


def provenance_tags(spec_name: str) -> dict[str, str]:
    """Who ran the study, with what, and the git commit of ptctl's code when it is a git checkout."""
    tags = {"mlflow.user": getpass.getuser(), "mlflow.source.type": "LOCAL",
            "mlflow.source.name": " ".join([Path(sys.argv[0]).name or "ptctl", *sys.argv[1:]])[:500] or spec_name}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=5)
        if commit.returncode == 0 and commit.stdout.strip():
            tags["mlflow.source.git.commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return tags
