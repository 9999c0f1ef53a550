"""What the MLflow runs say at a glance: each phase's verdict as params, metrics, tags and a sentence.

Pure (no MLflow): the driver hands these to `workers.mlflow_tracker.Tracker.log_verdict`. Every verdict is built
by its phase (`studies.phases`, `Phase.verdict`: its file names what it logs) from the phase's typed result as
`state.json` keeps it, so a resumed study logs the same verdicts.

The study run carries all of them; its description is every sentence followed by the spec's description.
`verdict_columns` names them as the MLflow UI's runs-table columns: the experiment's saved view `verdicts`
(`workers.mlflow_tracker.Tracker.save_view`) shows them, and the link `ptctl study run` prints opens it. The columns
are the keys the study's verdict holds (what its finished phases logged, each phase choosing its own:
`Phase.columns`), never a guess from the spec: a column no run has (a regret at a width one parametrization was
not transferred to) the UI leaves out.
Trial runs are named for a reader (`tune-07 lr=4.4e-3`), and `provenance_tags` say who ran what from where.
"""

from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

from studies.phases import PHASES, StudyState, Verdict, phases_of
from studies.phases.base import LENGTH, LOSSES
from studies.phases.tune import lr_text
from studies.spec import StudySpec


def study_verdict(spec: StudySpec, state: StudyState) -> Verdict:
    """Every finished phase's verdict (`Phase.verdict`) on one run, the study's; the sentence is the study run's
    description."""
    verdict = Verdict()
    for phase in phases_of(spec):
        if state.done(phase):
            own = PHASES[phase].verdict(spec, state.phases[phase])
            own.columns = PHASES[phase].columns(spec, own)
            verdict = verdict.merge(own)
    return verdict


# what every trial run logs (`workers.runner.TrialRecorder`): its loss among the losses, where ASHA stopped it
TRIAL_COLUMNS = ((LOSSES, "metrics.`eval_loss`"), (LENGTH, "metrics.`steps_done`"))


def verdict_columns(verdict: Verdict) -> list[str]:
    """The runs-table columns, as the MLflow UI names them (`metrics.`upper_bound``), that show what the study
    logged: its verdict's (`study_verdict`: each finished phase's `Phase.columns`, about 25 on a wide screen) and
    its trials' loss and length, by place (`studies.phases.base.PASS`...), then each run's description (its
    verdict sentence)."""
    placed = sorted([*verdict.columns, *TRIAL_COLUMNS], key=lambda column: column[0])
    return [*dict.fromkeys(name for _, name in placed), "attributes.`Description`"]


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
