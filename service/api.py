"""The HTTP endpoints. Each is thin: parse, authorize, call `Control`/`progress`, shape the response.

    POST /studies                 StudySpec as JSON or YAML → 201 + Location (Idempotency-Key: same key, same study)
    GET  /studies                 ?status=&limit=&offset= → a page, newest first
    GET  /studies/{id}            status, phase, per-phase progress, best hparams, MLflow ids and links
    GET  /studies/{id}/trials     the trial table (finished phases + the running phase's live rows)
    GET  /studies/{id}/report     the Markdown report and the certificate (409 until the study succeeded)
    POST /studies/{id}/cancel     → cancelled (409 if already finished)
    POST /studies/{id}/resume     interrupted | failed | cancelled → running
    GET  /healthz, GET /readyz    process up; store, Ray and MLflow reachable
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Annotated, Any

import httpx
import yaml
from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from service import policy
from service.auth import Admin, Read
from service.control import Control
from service.progress import phase_progress, read_state, redact_uri, trial_table
from service.schemas import (
    Check,
    MlflowInfo,
    Readiness,
    Report,
    Status,
    StudyDetail,
    StudyPage,
    StudySummary,
    TrialTable,
    finite,
)
from service.settings import Settings
from service.store import Study
from studies.spec import StudySpec

log = logging.getLogger(__name__)
router = APIRouter()
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPES = ("application/json", "")


def _control(request: Request) -> Control:
    return request.app.state.control


def _settings(request: Request) -> Settings:
    return request.app.state.settings


# ---------------------------------------------------------------------------------- bodies
def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows: use a finite number")


def _check_finite(data: Any, path: str = "") -> None:
    if isinstance(data, float) and not math.isfinite(data):
        raise HTTPException(422, f"{path or '(top level)'}: {data} is not allowed, use a finite number")
    if isinstance(data, dict):
        for k, v in data.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _check_finite(v, f"{path}[{i}]")


def parse_spec(body: bytes, content_type: str) -> StudySpec:
    """The request body as a `StudySpec`: 400 malformed, 415 unknown type, 422 invalid (with field paths)."""
    media = content_type.split(";")[0].strip().lower()
    try:
        if media in YAML_TYPES:
            data = yaml.safe_load(body.decode("utf-8"))
        elif media in JSON_TYPES or media.endswith("+json"):
            data = json.loads(body, parse_constant=_reject_constant)
        else:
            raise HTTPException(415, f"Content-Type {media!r} is not accepted: send application/json or "
                                "application/yaml")
    except UnicodeDecodeError:
        raise HTTPException(400, "the body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise HTTPException(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except yaml.YAMLError as exc:
        raise HTTPException(400, f"malformed YAML: {str(exc).splitlines()[0]}") from None
    except (ValueError, RecursionError) as exc:
        raise HTTPException(400, f"malformed body: {exc}"[:300]) from None
    if not isinstance(data, dict):
        raise HTTPException(422, f"the body must be a StudySpec object, not {type(data).__name__}: "
                            "see studies/catalog/tiny.yaml")
    _check_finite(data)
    try:
        return StudySpec.model_validate(data)
    except ValidationError as exc:
        errors = [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                  for e in exc.errors(include_url=False, include_context=False, include_input=False)]
        raise HTTPException(422, errors) from None
    except RecursionError:
        raise HTTPException(400, "the body is nested too deeply") from None


# ---------------------------------------------------------------------------------- studies
def summary(study: Study) -> StudySummary:
    return StudySummary(**{k: getattr(study, k) for k in StudySummary.model_fields})


@router.post("/studies", status_code=201, response_model=StudySummary, tags=["studies"], dependencies=[Admin],
             responses={200: {"model": StudySummary, "description": "replay of an Idempotency-Key"},
                        400: {}, 409: {}, 413: {}, 415: {}, 422: {}, 503: {}})
async def submit(request: Request, response: Response,
                 idempotency_key: Annotated[str | None, Header(max_length=255)] = None) -> StudySummary:
    """Validate a `StudySpec` (JSON, or YAML with `Content-Type: application/yaml`), store it, start it."""
    spec = parse_spec(await request.body(), request.headers.get("content-type", ""))
    await run_in_threadpool(policy.enforce, spec, _settings(request))  # what a remote spec may name (422)
    study, created = await run_in_threadpool(_control(request).submit, spec, idempotency_key)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/studies/{study.id}"
    return summary(study)


@router.get("/studies", response_model=StudyPage, tags=["studies"], dependencies=[Read])
def list_studies(request: Request, status_: Annotated[Status | None, Query(alias="status")] = None,
                 limit: Annotated[int, Query(ge=1, le=500)] = 50,
                 offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> StudyPage:
    items, total = _control(request).store.list(status_, limit, offset)
    return StudyPage(items=[summary(s) for s in items], total=total, limit=limit, offset=offset)


def _observed(request: Request, study: Study, fresh: bool = False
              ) -> tuple[dict[str, Any], list[dict[str, Any]], MlflowInfo]:
    """The study folder's state.json, its MLflow trial rows (cached unless `fresh`) and its MLflow ids;
    with MLflow unreachable, no rows and no ids."""
    mlflow = _control(request).mlflow
    state = read_state(_settings(request).data_dir / "studies" / study.id)
    try:
        return state, mlflow.live(study.spec, study.id, state, fresh), mlflow.info(study.spec, state)
    except Exception as exc:  # a read must not fail because MLflow is away: say so instead
        log.warning("MLflow look-up for %s failed: %s", study.id, exc)
        info = MlflowInfo(tracking_uri=redact_uri(mlflow.uri(study.spec)), experiment=mlflow.experiment(study.spec),
                          runs=state.get("runs") or {}, detail=f"MLflow unreachable: {type(exc).__name__}")
        return state, [], info


@router.get("/studies/{study_id}", response_model=StudyDetail, tags=["studies"], dependencies=[Read],
            responses={404: {}})
def get_study(request: Request, study_id: str) -> StudyDetail:
    study = _control(request).store.get(study_id)
    state, live, info = _observed(request, study)
    folder = _settings(request).data_dir / "studies" / study.id
    progress = phase_progress(folder, study.spec, state, study.planned, live)
    tune = state.get("phases", {}).get("tune", {})
    return StudyDetail(**summary(study).model_dump(), spec=study.spec, progress=progress,
                       best_hparams=tune.get("best_hparams"), mlflow=info)


@router.get("/studies/{study_id}/trials", response_model=TrialTable, tags=["studies"], dependencies=[Read],
            responses={404: {}})
def get_trials(request: Request, study_id: str) -> TrialTable:
    """The trial table: one row per trial."""
    study = _control(request).store.get(study_id)
    state, live, _ = _observed(request, study, fresh=True)  # every run id, even of a trial that just ended
    folder = _settings(request).data_dir / "studies" / study.id
    return TrialTable(study_id=study.id, trials=trial_table(folder, study.spec, state, live))


@router.get("/studies/{study_id}/report", response_model=Report, tags=["studies"], dependencies=[Read],
            responses={404: {}, 409: {}})
def get_report(request: Request, study_id: str) -> Report:
    study = _control(request).store.get(study_id)
    art = _settings(request).data_dir / "studies" / study.id / "artifacts"
    if study.status != "succeeded" or not (art / "report.md").exists():
        raise HTTPException(409, f"study {study.id} is {study.status}: its report is written when it succeeds; "
                            f"poll GET /studies/{study.id}")
    cert = art / "certificate.json"
    certificate = finite(json.loads(cert.read_text())) if cert.exists() else None
    return Report(study_id=study.id, status=study.status, markdown=(art / "report.md").read_text(),
                  certificate=certificate)


@router.post("/studies/{study_id}/cancel", response_model=StudySummary, tags=["studies"], dependencies=[Admin],
             responses={404: {}, 409: {}})
def cancel(request: Request, study_id: str) -> StudySummary:
    """Kill the study's driver and its Tune trials; everything logged so far stays."""
    return summary(_control(request).cancel(study_id))


@router.post("/studies/{study_id}/resume", response_model=StudySummary, tags=["studies"], dependencies=[Admin],
             responses={404: {}, 409: {}, 503: {}})
def resume(request: Request, study_id: str) -> StudySummary:
    """Start a new driver on the same study id: finished phases and trials are not run again."""
    policy.enforce(_control(request).store.get(study_id).spec, _settings(request), where=("spec",))  # as of now
    return summary(_control(request).resume(study_id))


# ---------------------------------------------------------------------------------- health
@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, tags=["health"], responses={503: {"model": Readiness}})
def readyz(request: Request, response: Response) -> Readiness:
    control, settings = _control(request), _settings(request)
    checks = {"store": _check(lambda: control.store.ping() or "reachable"),
              "ray": _check(control.executor.check),
              "mlflow": _check(lambda: _mlflow_check(settings.tracking_uri))}
    ready = all(c.ok for c in checks.values())
    response.status_code = 200 if ready else status.HTTP_503_SERVICE_UNAVAILABLE
    return Readiness(ready=ready, checks=checks)


def _check(probe) -> Check:
    try:
        return Check(ok=True, detail=probe())
    except Exception as exc:
        return Check(ok=False, detail=f"{type(exc).__name__}: {exc}"[:500])


def _mlflow_check(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        httpx.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
        return f"{redact_uri(uri)} answers /health"
    if uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///")
        return f"SQLite store {path} ({'exists' if os.path.exists(path) else 'made on first study'})"
    return f"{redact_uri(uri)} (not probed)"
