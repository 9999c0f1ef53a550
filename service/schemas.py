"""The API's response bodies: shared by the server (FastAPI response models) and the typed client.

Request bodies are `studies.spec.StudySpec` itself (JSON, or YAML with `Content-Type: application/yaml`).
Pure pydantic: the CLI client imports this without FastAPI, Ray or MLflow.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from studies.status import StudyStatus

Status = StudyStatus  # the study statuses, defined once (studies/status.py)


class PhaseProgress(BaseModel):
    """One phase's trials. `done` = completed or early-stopped (ASHA); `running` = started, not finished
    (after an interruption: the trials that were cut off and rerun on resume). Finished phases count
    their trial table; the others their MLflow trial runs, refreshed every ~2 s."""

    status: Literal["pending", "running", "done"] = Field(description="running: started, not finished")
    planned: int | None = Field(None, description="trials the driver planned (known once the phase started)")
    done: int = 0
    running: int = 0
    failed: int = 0
    diverged: int = 0
    best_eval_loss: float | None = Field(None, description="lowest eval loss of a completed trial so far")


class MlflowInfo(BaseModel):
    tracking_uri: str = Field(description="credentials removed")
    experiment: str
    experiment_id: str | None = Field(None, description="None until the driver created the experiment")
    runs: dict[str, str] = Field(default_factory=dict, description='"study" and each phase → MLflow run id')
    links: dict[str, str] = Field(default_factory=dict, description="the same keys → MLflow UI addresses")
    detail: str | None = Field(None, description="why the ids are missing, if MLflow could not be asked")


class StudySummary(BaseModel):
    id: str
    name: str
    status: Status
    phase: str | None = Field(None, description="the phase the driver is in (last one, once stopped)")
    spec_hash: str
    error: str | None = None
    attempts: int = Field(description="driver starts: 1 + resumes")
    created_at: dt.datetime
    updated_at: dt.datetime


class StudyDetail(StudySummary):
    spec: dict[str, Any]
    progress: dict[str, PhaseProgress] = Field(description="per phase of the spec, in order")
    best_hparams: dict[str, float] | None = Field(None, description="the tuned centre, once tune is done")
    mlflow: MlflowInfo


class StudyPage(BaseModel):
    items: list[StudySummary]
    total: int
    limit: int
    offset: int


class TrialTable(BaseModel):
    study_id: str
    trials: list[dict[str, Any]] = Field(description="rows of the tidy trial table (analysis/table.py), "
                                                     "live rows for the running phase, plus mlflow_run_id")


class Report(BaseModel):
    study_id: str
    status: Status
    markdown: str
    certificate: dict[str, Any] | None = Field(None, description="the verify phase's certificate, if any")


class Check(BaseModel):
    ok: bool
    detail: str


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, Check]


def finite(value: Any) -> Any:
    """`value` with every NaN/±inf float replaced by None (JSON has no NaN), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


class FieldError(BaseModel):
    loc: list[str | int] = Field(description='where: ["body", "tune", "num_trials"], ["query", "limit"], ...')
    msg: str = Field(description="what is wrong and how to fix it")
    type: str


class Error(BaseModel):
    """Every 4xx/5xx answer of the API (FastAPI's shape)."""

    detail: str | list[FieldError] = Field(description="a message, or (422) one entry per invalid field")
