"""The API's response bodies: shared by the server (FastAPI response models) and the typed client.

Request bodies are `studies.spec.StudySpec` itself (JSON, or YAML with `Content-Type: application/yaml`).
Pure pydantic: the CLI client imports this without FastAPI, Ray or MLflow.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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


Interval = tuple[float, float]


class TuneVerdict(BaseModel):
    """The tune phase's winner (its hparams: `best_hparams`)."""

    best_eval_loss: float | None = Field(description="the winner's eval loss at the base width")
    n_trials: int = Field(description="tune trials run")
    n_diverged: int = Field(description="tune trials whose loss diverged")


class TransferPoint(BaseModel):
    width: int = Field(description="a width the winner was transferred to")
    eval_loss: float | None = Field(description="its mean eval loss over seeds (None: every seed diverged)")


class WidthTrendVerdict(BaseModel):
    """Whether the transferred hparams' eval loss falls with width under one parametrization
    (`analysis.width_trends`)."""

    parametrization: str = Field(description="mup (the judged one) or standard (told beside it)")
    verdict: str = Field(description="wider is better, wider is worse, within noise or not judged (too few runs)")
    slope: float | None = Field(description="eval loss per doubling of width (None: fewer than two widths)")
    ci95: Interval | None = Field(description="the slope's 95 % interval from the fit's residuals (None: too few "
                                              "runs to judge)")
    warning: bool = Field(description="mup got worse with width: usually a group's lr or init not scaled")
    line: str = Field(description="the verdict with the widths, the losses and the slope")


class TransferVerdict(BaseModel):
    """The transfer phase's zero-shot eval loss per width, and whether it falls with width."""

    widths: list[TransferPoint] = Field(description="one point per transfer width, narrowest first")
    trends: list[WidthTrendVerdict] = Field([], description="per parametrization, mup first: the eval loss against "
                                                            "width (empty: a study judged before the check)")


class VerifyVerdict(BaseModel):
    """The verify phase's local-optimality certificate of the transferred centre (`analysis.certify`)."""

    certified: bool = Field(description="the bound is at most p: the centre is in its neighbourhood's top fraction p")
    bound: float = Field(description="one-sided (1-alpha) Clopper-Pearson upper bound on the fraction of "
                                     "neighbours better than the centre")
    p: float = Field(description="the top fraction the certificate claims")
    alpha: float = Field(description="1 - the bound's confidence level")
    n_better: int = Field(description="samples that beat the centre by more than the tolerance")
    n_samples: int = Field(description="samples judged (failed runs left out)")
    centre_rank: int = Field(description="the centre's 1-based rank among the samples and itself")
    centre_loss: float | None = Field(description="the centre's mean eval loss over its seeds")
    verdict: str = Field(description="the certificate in one sentence")


class DriftVerdict(BaseModel):
    """How far one hparam's optimum moves per doubling of width, training steps or depth (`analysis.lr_drift`)."""

    hparam: str = Field(description="the swept hparam")
    axis: str = Field(description="what the drift is per doubling of: width, horizon (training steps), depth or "
                                  "batch (the batch size)")
    width: int | None = Field(None, description="the width a horizon, depth or batch drift was measured at")
    parametrization: str = Field(description="the judged parametrization (mup; along depth completep)")
    drift: float | None = Field(description="its optimum's slope in log2(hparam) per doubling")
    ci95: Interval | None = Field(None, description="the drift's 95 % interval from each seed's optima "
                                                    "(None: too few seeds)")
    baseline: str | None = Field(None, description="the parametrization shown beside it (standard; along depth "
                                                   "none), if the sweep ran it")
    baseline_drift: float | None = Field(None, description="its drift, for comparison")
    threshold: float = Field(description="the largest |drift| that passes")
    passed: bool = Field(description="|drift| is at most the threshold")
    verdict: str = Field(description="the drift in one sentence")


class RegretVerdict(BaseModel):
    """What the transferred value of one hparam cost at one swept width (`analysis.transfer_regret`)."""

    hparam: str = Field(description="the swept hparam")
    parametrization: str = Field(description="the parametrization whose sweep is judged")
    width: int = Field(description="the swept width the value was transferred to")
    regret: float | None = Field(description="loss at the transferred value minus the sweep's optimum, in nats "
                                             "(None: see note)")
    regret_pct: float | None = Field(description="the regret as a percentage of the optimum's loss")
    ci95: Interval | None = Field(None, description="95 % interval of the per-seed regrets in nats "
                                                    "(None: fewer than 2 seeds)")
    batch_size: int | None = Field(None, description="a batch sweep's: the batch size the base batch's lr was "
                                                     "carried to")
    seq_len: int | None = Field(None, description="a context sweep's: the sequence length the base context's lr "
                                                  "was carried to")
    note: str = Field("", description="why a value is missing, if one is")


class ForecastVerdict(BaseModel):
    """The target's optimal lr forecast from the validate sweeps (`analysis.forecast`)."""

    width: int = Field(description="the target's width")
    steps: int = Field(description="the target's training steps")
    batch_size: int = Field(description="the target's batch size")
    lr: float = Field(description="the forecast optimal lr")
    ci95: Interval | None = Field(description="its 95 % interval in lr (None: no residual degrees of freedom)")
    transferred_regret: float | None = Field(description="the tuned lr's expected loss there, in nats")
    steplaw_lr: float | None = Field(description="Step Law's η*(N, D) there (None: no parameter count)")
    held_out_error_log2: float | None = Field(description="the forecast's error at the held-out width, log2(lr)")
    steplaw_held_out_error_log2: float | None = Field(description="Step Law's error there, log2(lr)")
    conformal_ci95: Interval | None = Field(None, description="the conformal 95 % interval in lr: ± the leave-out "
                                                              "multiplier of the prediction's standard error")
    leave_out_points: int | None = Field(None, description="swept points predicted by a fit without their width "
                                                           "(None: fewer than three widths)")
    ci95_covered: int | None = Field(None, description="of those, how many the 95 % t-interval held")
    ci95_scored: int | None = Field(None, description="of those, how many had a t-interval")
    conformal_covered: int | None = Field(None, description="how many the conformal interval held, each against "
                                                            "the others' quantile or the pooled multiplier")
    conformal_scored: int | None = Field(None, description="how many had a standard error to score")
    conformal_source: str | None = Field(None, description="the multiplier's: 'leave-out' (the 95 % quantile of "
                                                           "the study's own points), 'pooled' (the catalog's) or "
                                                           "'max' (their largest: a level of n/(n+1))")
    conformal_level: float | None = Field(None, description="the conformal interval's guaranteed coverage")
    leave_out_median_error_log2: float | None = Field(None, description="median |error| over them, log2(lr)")
    leave_out_p90_error_log2: float | None = Field(None, description="90th percentile |error|, log2(lr)")
    leave_out_median_error_nats: float | None = Field(None, description="median loss above the curve's minimum")
    steplaw_leave_out_median_error_log2: float | None = Field(None, description="Step Law's median |error| over "
                                                                                "the same points, log2(lr)")


class ValidateVerdict(BaseModel):
    """The validate phase's μTransfer evidence: each drift, the transfer regret and the lr forecast."""

    passed: bool = Field(description="every drift passed")
    drifts: list[DriftVerdict] = Field(description="along width (lr first, then each swept hparam), then along "
                                                   "training steps per width, along depth, along the batch size")
    regret: list[RegretVerdict] = Field(default_factory=list, description="per swept hparam, parametrization "
                                                                          "and transferred width, then the batch "
                                                                          "sweep's")
    forecast: ForecastVerdict | None = Field(None, description="the target's optimal lr (two or more widths)")


class CompareBudget(BaseModel):
    budget: float = Field(description="the parameter budget")
    winner: str | None = Field(description="the family with the lowest mean eval loss (None: none finished)")
    eval_loss: float | None = Field(description="the winner's mean eval loss over seeds")
    transferred_rank: int | None = Field(description="the rank of the study's transferred model (1 = best; None: "
                                                     "it finished no seed)")


class CompareVerdict(BaseModel):
    """The compare phase's ranking of every family at every budget."""

    budgets: list[CompareBudget] = Field(description="one entry per budget, smallest first")


class Verdicts(BaseModel):
    """Each finished phase's verdict, built from the typed results `state.json` keeps (what the report renders);
    a phase that has not finished, or does not run, is null. A new phase kind adds its own field here."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)  # `validate` shadows BaseModel's

    tune: TuneVerdict | None = Field(None, description="the tune phase's winner")
    transfer: TransferVerdict | None = Field(None, description="the zero-shot loss per transfer width")
    verify: VerifyVerdict | None = Field(None, description="the local-optimality certificate")
    validate_: ValidateVerdict | None = Field(None, alias="validate", description="the drifts and the regret")
    compare: CompareVerdict | None = Field(None, description="every family ranked at every budget")


class VerdictBrief(BaseModel):
    """A study's verdicts in one line, for lists (the full ones: `GET /studies/{id}`'s `verdicts`)."""

    certified: bool | None = Field(None, description="verify's certificate holds (None: no finished verify)")
    bound: float | None = Field(None, description="verify's upper bound on the fraction of better neighbours")
    drift_passed: bool | None = Field(None, description="every validate drift passed (None: no finished validate)")
    line: str = Field(description='e.g. "certified (bound 0.046 ≤ p 0.05); drift passed (lr +0.02)"')


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
    verdicts: Verdicts = Field(default_factory=Verdicts, description="each finished phase's verdict")
    mlflow: MlflowInfo


class StudyListItem(StudySummary):
    verdict: VerdictBrief | None = Field(None, description="the finished phases' verdicts in one line (None: "
                                                           "no phase finished)")


class StudyPage(BaseModel):
    items: list[StudyListItem]
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


class PhasePlan(BaseModel):
    """One phase of a plan: its trials, their cost, and how long they will take on the server."""

    trials: int = Field(description="trials the phase plans (tune: tune.num_trials)")
    steps: float = Field(description="optimizer steps over its trials (tune under ASHA: the expectation)")
    flops: float | None = Field(None, description="training FLOPs over its trials (None: the family registers no "
                                                  "FLOP counts)")
    lanes: int | None = Field(None, description="trials running at once on the server (None: not probed)")
    seconds: float | None = Field(None, description="estimated wall time of the phase (None: not probed, or one of "
                                                    "its trial shapes could not be)")


class StudyPlan(BaseModel):
    """What a spec would run and how long it would take, from a few timed steps of each trial shape on the
    server; nothing is stored or started."""

    name: str
    spec_hash: str
    phases: dict[str, PhasePlan] = Field(description="per phase of the spec, in order")
    proxy_pct: dict[int, float] = Field(default_factory=dict, description="tune's FLOPs as a percentage of one "
                                                                          "training run at each transfer width")
    total_s: float | None = Field(None, description="estimated wall time of the whole study, Ray's start included "
                                                    "(None: not probed)")
    uncertainty: float | None = Field(None, description="the estimate's relative band: 0.25 for ±25 %")
    assumptions: str = Field("", description="what the estimate assumes, in one line (the probe, the trials at a "
                                             "time, ASHA, the load)")
    unprobed: list[str] = Field(default_factory=list, description="each trial shape the probe could not time, as "
                                                                  "'label: why' (its phase then has no estimate)")
    line: str = Field("", description='the estimate as the CLI prints it, e.g. "estimate: tune 40 s · ... · '
                                      'total ≈ 5 min (±25 %)"')


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
