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
(`workers.tracking.Tracker.save_view`) shows them, and the link `ptctl study run` prints opens it. The columns
are the keys the study's verdict holds (what its finished phases logged), never a guess from the spec: a
column no run has (a regret at a width one parametrization was not transferred to) the UI leaves out.
Trial runs are named for a reader (`tune-07 lr=4.4e-3`), and `provenance_tags` say who ran what from where.
"""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
from pathlib import Path

from studies.phases import PHASES, StudyState, Verdict
from studies.phases.tune import lr_text
from studies.spec import StudySpec


def study_verdict(spec: StudySpec, state: StudyState) -> Verdict:
    """Every finished phase's verdict (`Phase.verdict`) on one run, the study's; the sentence is the study run's
    description."""
    verdict = Verdict()
    for phase in spec.phases():
        if state.done(phase):
            verdict = verdict.merge(PHASES[phase].verdict(spec, state.phases[phase]))
    return verdict


# The saved view's columns, in its order: a logged key is shown when it fully matches one of these patterns, placed
# by the first it matches (keys of one pattern keep the order they were logged in); each searched hparam's `best.`
# param goes before the widths. The horizon drifts and verify's other counts stay on the run pages: the runs
# table shows about 25 columns on a wide screen.
SHOWN: tuple[tuple[str, str], ...] = (
    ("tags", r"certified"), ("tags", r"(?!lr_horizon_)\w+_drift_passed"),
    ("metrics", r"upper_bound|n_better|centre_rank|best_lead_pct"), ("metrics", r"best_eval_loss|eval_loss"),
    ("metrics", r"(?!lr_depth_|lr_horizon_)\w+_drift\.\w+"), ("metrics", r"regret_pct\.lr\..+"),
    ("metrics", r"lr_depth_drift\.\w+"), ("metrics", r"steps_done"), ("params", r"base_width|target_widths"))
TRIAL_METRICS = ("eval_loss", "steps_done")  # what every trial run logs (`workers.runner.TrialRecorder`)


def verdict_columns(spec: StudySpec, verdict: Verdict) -> list[str]:
    """The runs-table columns, as the MLflow UI names them (`metrics.`upper_bound``), that show what the study
    logged: its verdict (`verdict`: its finished phases', `study_verdict`) and its trials' loss and length. The
    certificate, the loss per width, each drift and lr's transfer regret, where ASHA stopped a trial, each searched
    hparam's winner (frozen ones are constants) and the widths, then each run's description (its verdict sentence).
    """
    metrics = [k for row in verdict.metrics for k in row if k != "step"]
    logged = {"tags": list(verdict.tags), "metrics": list(dict.fromkeys([*metrics, *TRIAL_METRICS])),
              "params": list(verdict.params)}
    searched = [("params", rf"best\.{re.escape(h)}") for h in spec.space.searched()]
    columns: dict[str, None] = {}
    for group, pattern in (*SHOWN[:-1], *searched, SHOWN[-1]):
        columns |= dict.fromkeys(f"{group}.`{k}`" for k in logged[group] if re.fullmatch(pattern, k))
    return [*columns, "attributes.`Description`"]


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
