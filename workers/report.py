"""A trial's report: the one form its result takes from the training loop (`workers.train`) to its trial-table row
(`workers.runner.trial_row`) and its MLflow run (`workers.runner.TrialRecorder`), across Ray Tune as one JSON field."""

from __future__ import annotations

import json
import math

from pydantic import BaseModel, ConfigDict

from analysis.constants import TrialStatus

Row = dict[str, int | float]  # one logged step: "step" and the per-step metrics (each logged to MLflow as it is)


class TrialReport(BaseModel):
    """What a trial reports, the one form its result takes from the loop to its trial-table row and MLflow run:
    its final values, its rows (every logged step), its model facts and the batch it trained in. A report sent
    while the trial trains has status "running" and the rows since the last one."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    status: TrialStatus
    eval_loss: float = math.nan  # the last evaluation (NaN unless completed)
    best_eval_loss: float = math.nan
    train_loss: float = math.nan
    steps: int = 0
    tokens: int = 0
    wall_time_s: float | None = None
    tokens_per_s: float = 0.0
    params: int | None = None
    eval_curve: list[tuple[int, float]] = []  # (tokens, eval loss) at every evaluation
    rows: list[Row] = []
    message: str = ""
    lr_multipliers: dict[str, float] = {}  # per parameter group: its lr / the base lr
    run_params: dict[str, str] = {}  # the model's `run_params()` (a mup family's infshapes)
    batch: str | None = None  # the batch it trained in as a member ("i/n (K members)"), None alone


def dump_reports(reports: list[TrialReport]) -> str:
    """Reports as one JSON string (NaN kept): how they cross Ray Tune (Tune's loggers skip a string)."""
    return json.dumps([r.model_dump(mode="json") for r in reports])


def load_reports(text: str | None) -> list[TrialReport]:
    """`dump_reports`' reports again ([] for none)."""
    return [TrialReport.model_validate(r) for r in json.loads(text)] if text else []
