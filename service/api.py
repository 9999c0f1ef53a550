"""The HTTP endpoints. Each is thin: parse, authorize, call `Control`/`progress`, shape the response.

    POST /studies                 StudySpec as JSON or YAML → 201 + Location (Idempotency-Key: same key, same study)
    GET  /studies                 ?status=&limit=&offset= → a page, newest first, each with its verdicts' line
    GET  /studies/{id}            status, phase, per-phase progress, best hparams, verdicts, MLflow ids and links
    GET  /studies/{id}/trials     the trial table (finished phases + the running phase's live rows)
    GET  /studies/{id}/report     the Markdown report and the certificate (409 until the study succeeded)
    POST /studies/{id}/cancel     → cancelled (409 if already finished)
    POST /studies/{id}/resume     interrupted | failed | cancelled → running
    POST /plans                   StudySpec → trials, FLOPs and wall time per phase, timed here; nothing stored
    GET  /healthz, GET /readyz    process up; store, Ray and MLflow reachable
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Annotated, Any, cast

import httpx
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from service import policy
from service.auth import Admin, Read
from service.control import Control
from service.field_errors import segments
from service.intake import read_spec
from service.progress import phase_progress, redact_uri, trial_table
from service.schemas import (
    Check,
    Error,
    MlflowInfo,
    Readiness,
    Report,
    Status,
    StudyDetail,
    StudyListItem,
    StudyPage,
    StudyPlan,
    StudySummary,
    TrialTable,
    finite,
)
from service.settings import Settings
from service.store import Study
from service.verdicts import brief, study_verdicts
from studies.phases import StudyState, TuneResult
from studies.spec import StudySpec
from studies.status import StudyStatus
from workers.door import Door
from workers.folder import StudyFolder

log = logging.getLogger(__name__)
router = APIRouter()


async def _control(request: Request) -> Control:  # async: FastAPI runs a sync dependency on a worker thread
    return cast(Control, request.app.state.control)


async def _settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


ControlDep = Annotated[Control, Depends(_control)]
SettingsDep = Annotated[Settings, Depends(_settings)]


def _folder(control: Control, study: Study) -> StudyFolder:
    return StudyFolder(study.id, control.data_dir)


# ---------------------------------------------------------------------------------- errors
ERRORS = {400: "malformed body", 401: "missing or unknown bearer token (only with PTCTL_API_TOKENS set)",
          403: "a read-only token on a mutating endpoint", 404: "no such study", 409: "illegal state change",
          413: "body over PTCTL_MAX_BODY_BYTES", 415: "Content-Type not JSON or YAML, or not UTF-8",
          422: "invalid input: one entry per field (loc, msg)", 431: "headers over PTCTL_MAX_HEADER_BYTES",
          503: "Ray unreachable, or every spec parser busy"}
READ, ADMIN = (401,), (401, 403)  # what the auth dependencies answer


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error codes an operation answers (431: every operation, added by the app)."""
    return {code: {"model": Error, "description": ERRORS[code]} for code in codes}


# ---------------------------------------------------------------------------------- studies
def summary(study: Study) -> StudySummary:
    return StudySummary(**{k: getattr(study, k) for k in StudySummary.model_fields})


@router.post("/studies", status_code=201, response_model=StudySummary, tags=["studies"], dependencies=[Admin],
             responses={200: {"model": StudySummary, "description": "replay of an Idempotency-Key"},
                        **errors(400, *ADMIN, 409, 413, 415, 422, 503)})
async def submit(request: Request, response: Response, control: ControlDep, settings: SettingsDep,
                 idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None
                 ) -> StudySummary:
    """Validate a `StudySpec` (JSON, or YAML with `Content-Type: application/yaml`), store it and start it; a known
    `Idempotency-Key` answers its study (200), started first if its driver never began (a submit cut short)."""
    spec = await read_spec(request)  # off the event loop, within the PTCTL_MAX_* bounds (service/limits.py)
    await run_in_threadpool(policy.enforce, spec, settings)  # what a remote spec may name (422)
    await run_in_threadpool(_check_model, request.app.state.door, spec)
    study, created = await run_in_threadpool(control.submit, spec, idempotency_key)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/studies/{study.id}"
    return summary(study)


def _check_model(door: Door, spec: StudySpec) -> None:
    """422 when the study's largest trial cannot fit its trials' memory (arithmetic: nothing is built), or when its
    model breaks ptctl's model contract (`workers.model_check`, built small in a capped child: `workers.door`),
    before it is stored; 503 when the check cannot start."""
    from studies.members import memory_problem
    from workers.door import DoorUnavailable
    from workers.probe import trial_memory

    problem = memory_problem(spec, *trial_memory())
    if problem is not None:
        field, msg = problem
        raise HTTPException(422, [{"loc": ["body", *segments(field)], "msg": msg, "type": "memory"}])
    try:
        refused = door.check(spec)
    except DoorUnavailable as exc:
        raise HTTPException(503, f"{exc}: retry in a minute") from None
    if refused is not None:
        raise HTTPException(422, [{"loc": ["body", "model"], "msg": refused.message, "type": f"model_{refused.kind}"}])


@router.get("/studies", response_model=StudyPage, tags=["studies"], dependencies=[Read],
            responses=errors(*READ, 422))
def list_studies(control: ControlDep, status_: Annotated[Status | None, Query(alias="status")] = None,
                 limit: Annotated[int, Query(ge=1, le=500)] = 50,
                 offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> StudyPage:
    items, total = control.store.list(status_, limit, offset)
    return StudyPage(items=[_listed(control, s) for s in items], total=total, limit=limit, offset=offset)


def _listed(control: Control, study: Study) -> StudyListItem:
    """The study's summary with its verdicts in one line, read from its folder's state.json."""
    verdict = brief(study_verdicts(_folder(control, study).read_state()))
    return StudyListItem(**summary(study).model_dump(), verdict=verdict)


def _observed(control: Control, study: Study, fresh: bool = False
              ) -> tuple[StudyState | None, list[dict[str, Any]], MlflowInfo]:
    """The study folder's state.json, its MLflow trial rows (cached unless `fresh`) and its MLflow ids; with
    MLflow down or slow, no rows (or the last seen) and no ids (`MlflowView.observe`: a read never waits for it)."""
    state = _folder(control, study).read_state()
    return state, *control.mlflow.observe(study.spec, study.id, state, fresh)


@router.get("/studies/{study_id}", response_model=StudyDetail, tags=["studies"], dependencies=[Read],
            responses=errors(*READ, 404))
def get_study(control: ControlDep, study_id: str) -> StudyDetail:
    study = control.store.get(study_id)
    state, live, info = _observed(control, study)
    progress = phase_progress(_folder(control, study), study.spec, state, study.planned, live)
    tune = state.result("tune", TuneResult) if state else None
    return StudyDetail(**summary(study).model_dump(), spec=study.spec, progress=progress,
                       best_hparams=tune.best_hparams if tune else None, verdicts=study_verdicts(state), mlflow=info)


@router.get("/studies/{study_id}/trials", response_model=TrialTable, tags=["studies"], dependencies=[Read],
            responses=errors(*READ, 404))
def get_trials(control: ControlDep, study_id: str) -> TrialTable:
    """The trial table: one row per trial."""
    study = control.store.get(study_id)
    state, live, _ = _observed(control, study, fresh=True)  # every run id, even of a trial that just ended
    return TrialTable(study_id=study.id, trials=trial_table(_folder(control, study), study.spec, state, live))


@router.get("/studies/{study_id}/report", response_model=Report, tags=["studies"], dependencies=[Read],
            responses=errors(*READ, 404, 409))
def get_report(control: ControlDep, study_id: str) -> Report:
    study = control.store.get(study_id)
    folder = _folder(control, study)
    if study.status != StudyStatus.SUCCEEDED or not folder.report.exists():
        raise HTTPException(409, f"study {study.id} is {study.status}: its report is written when it succeeds; "
                            f"poll GET /studies/{study.id}")
    cert = folder.certificate
    certificate = finite(json.loads(cert.read_text())) if cert.exists() else None
    return Report(study_id=study.id, status=study.status, markdown=folder.report.read_text(), certificate=certificate)


@router.post("/studies/{study_id}/cancel", response_model=StudySummary, tags=["studies"], dependencies=[Admin],
             responses=errors(*ADMIN, 404, 409))
def cancel(control: ControlDep, study_id: str) -> StudySummary:
    """Kill the study's driver and its Tune trials; everything logged so far stays."""
    return summary(control.cancel(study_id))


@router.post("/studies/{study_id}/resume", response_model=StudySummary, tags=["studies"], dependencies=[Admin],
             responses=errors(*ADMIN, 404, 409, 503))
def resume(control: ControlDep, settings: SettingsDep, study_id: str) -> StudySummary:
    """Start a new driver on the same study id: finished phases and trials are not run again."""
    policy.enforce(control.store.get(study_id).spec, settings, where=("spec",))  # as of now
    return summary(control.resume(study_id))


@router.post("/plans", response_model=StudyPlan, tags=["studies"], dependencies=[Admin],
             responses=errors(400, *ADMIN, 413, 415, 422, 503))  # admin: its timed steps take the studies' cores
async def plan(request: Request, settings: SettingsDep,
               probe: Annotated[bool, Query(description="false: trials, steps and FLOPs only, no timed steps")] = True
               ) -> StudyPlan:
    """Plan a `StudySpec` (the body of POST /studies) without storing or starting it: per phase its trials, steps,
    FLOPs and the wall time estimated from a few timed steps of each trial shape on this server."""
    spec = await read_spec(request)
    await run_in_threadpool(policy.enforce, spec, settings)
    await run_in_threadpool(_check_model, request.app.state.door, spec)
    from service.plan import COMPARE_NOTE, study_plan

    if spec.compare is not None:
        raise HTTPException(422, [{"loc": ["body", "compare"], "msg": f"the plan is {COMPARE_NOTE}",
                                   "type": "value_error"}])
    return await run_in_threadpool(study_plan, spec, probe, settings.ray_num_cpus)


# ---------------------------------------------------------------------------------- health
@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, tags=["health"], responses={503: {"model": Readiness}})
def readyz(response: Response, control: ControlDep, settings: SettingsDep) -> Readiness:
    checks = {"store": _check(lambda: _store_check(control)),
              "ray": _check(control.executor.check),
              "mlflow": _check(lambda: _mlflow_check(settings.tracking_uri))}
    ready = all(c.ok for c in checks.values())
    response.status_code = 200 if ready else status.HTTP_503_SERVICE_UNAVAILABLE
    return Readiness(ready=ready, checks=checks)


def _check(probe: Callable[[], str]) -> Check:
    try:
        return Check(ok=True, detail=probe())
    except Exception as exc:
        return Check(ok=False, detail=f"{type(exc).__name__}: {exc}"[:500])


def _store_check(control: Control) -> str:
    control.store.ping()
    return "reachable"


def _mlflow_check(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        httpx.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
        return f"{redact_uri(uri)} answers /health"
    if uri.startswith("sqlite:///"):  # its path is the operator's business: /readyz needs no token
        return f"SQLite store ({'exists' if os.path.exists(uri.removeprefix('sqlite:///')) else 'made on first study'})"
    return f"{redact_uri(uri)} (not probed)"
