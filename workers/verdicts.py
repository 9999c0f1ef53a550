"""What the MLflow runs say at a glance: each phase's verdict as params, metrics, tags and a sentence.

Pure (no MLflow): the driver hands these to `workers.tracking.Tracker.log_verdict`. Every verdict is built
by its phase (`studies.phases`, `Phase.verdict`) from the phase's typed result as `state.json` keeps it, so a
resumed study logs the same verdicts.

| phase | params | metrics | tags |
|---|---|---|---|
| tune | `best.<hparam>`, `base_width` | `best_eval_loss`, `n_trials` | |
| transfer | `base_width`, `target_widths` | `eval_loss` with step = width (MLflow plots loss vs width) | |
| verify | `verify_width` | `upper_bound`, `n_better`, `centre_rank`, `n_samples`, `centre_loss` | `certified` |
| validate | | `<hparam>_drift.<parametrization>` (lr and each of validate.hparams) | `<hparam>_drift_passed` |

verify also logs `noise_better_expected` when the centre's seed noise is known (two or more seeds, a spread), and
`best_lead` / `best_lead_pct`, the best sample's lead over the centre. validate also logs
`regret.<hparam>.<parametrization>.w<W>` and `regret_pct...`: what the transferred value cost at each swept width
transferred to (`analysis.regret`); with validate.depths, `lr_depth_drift.<completep|none>` (per doubling of depth)
and the tag `lr_depth_drift_passed`.
Each also has a sentence: the winner, the loss per width, the certificate, the drift verdict.

The study run carries all of them; its description is every sentence followed by the spec's description.
`verdict_columns` names them as the MLflow UI's runs-table columns: the experiment's saved view `verdicts`
(`workers.tracking.Tracker.save_view`) shows them, and the link `ptctl study run` prints opens it.
Trial runs are named for a reader (`tune-07 lr=4.4e-3`), and `provenance_tags` say who ran what from where.
"""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

from studies.arch import DEPTH_SWEEP
from studies.phases import PHASES, StudyState, Verdict
from studies.phases.tune import lr_text
from studies.phases.validate import regret_widths
from studies.spec import StudySpec


def study_verdict(spec: StudySpec, state: StudyState) -> Verdict:
    """Every finished phase's verdict (`Phase.verdict`) on one run, the study's; the sentence is the study run's
    description."""
    verdict = Verdict()
    for phase in spec.phases():
        if state.done(phase):
            verdict = verdict.merge(PHASES[phase].verdict(spec, state.phases[phase]))
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
        metrics += ["upper_bound", "n_better", "centre_rank", "best_lead_pct"]
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
        metrics += [f"regret_pct.lr.{p}.w{w}" for w in regret_widths(spec) for p in spec.validate_.parametrizations]
        if spec.validate_.depths:
            metrics += [f"lr_depth_drift.{d}" for d in DEPTH_SWEEP]
            tags.append("lr_depth_drift_passed")
    if "tune" in phases:
        metrics.append("steps_done")
    return [*(f"{group}.`{name}`" for group, names in (("tags", tags), ("metrics", metrics), ("params", params))
              for name in names), "attributes.`Description`"]


def trial_run_name(trial_key: str, hparams: dict[str, float], number: int | None = None) -> str:
    """`tune-07 lr=4.4e-3` for the 7th tune trial (`number`, Tune's count), else the trial key and its lr."""
    stem = f"tune-{number:02d}" if trial_key.startswith("tune-") and number is not None else trial_key
    return f"{stem} lr={lr_text(hparams['lr'])}" if "lr" in hparams and "-lr" not in trial_key else stem


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
