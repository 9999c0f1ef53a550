"""The FastAPI application: `create_app(settings)`; `ptctl serve` runs it under uvicorn.

Start-up (lifespan): migrate the store (Alembic, to head) → create and migrate the MLflow store (so
studies started together do not race to do it) → connect to Ray (the embedded head or
`RAY_ADDRESS`; a failure is logged and retried on the next request that needs Ray, and `/readyz`
reports it) → reconcile studies left `running` by an earlier API process → start the reconciler
thread. Shutting down stops only that thread: drivers and the Ray head keep running.

Middleware: request bodies over `PTCTL_MAX_BODY_BYTES` get 413 before they are read. Errors are
JSON `{"detail": ...}`: 404 unknown id, 409 illegal state change, 422 invalid spec (field paths),
503 Ray unreachable. OpenAPI at `/openapi.json`, interactive docs at `/docs`.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api import router
from service.control import Control, DriverRunning, ExecutionUnavailable, Executor, Reconciler
from service.progress import MlflowView, redact_uri
from service.settings import Settings
from service.store import IdempotencyConflict, IllegalTransition, NotFound, Store
from studies.spec import StudySpec

log = logging.getLogger(__name__)


class BodyLimit:
    """413 for a request body over `max_bytes`: by its Content-Length, or while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            code = 413 if length.isdigit() else 400
            detail = (f"request body over {self.max_bytes} bytes (PTCTL_MAX_BODY_BYTES)" if code == 413
                      else "invalid Content-Length header")
            return await JSONResponse({"detail": detail}, code)(scope, receive, send)
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, f"request body over {self.max_bytes} bytes (PTCTL_MAX_BODY_BYTES)")
            return message

        await self.app(scope, limited, send)


def _errors(app: FastAPI) -> None:
    def handler(code: int):
        async def respond(_: Request, exc: Exception) -> JSONResponse:
            detail = f"no study {exc.args[0]!r}: list them with GET /studies" if code == 404 else str(exc)
            return JSONResponse({"detail": detail}, code)

        return respond

    app.add_exception_handler(NotFound, handler(404))
    for exc in (IllegalTransition, IdempotencyConflict, DriverRunning):
        app.add_exception_handler(exc, handler(409))
    app.add_exception_handler(ExecutionUnavailable, handler(503))


def _openapi(app: FastAPI) -> dict:
    """OpenAPI with the `StudySpec` request body of POST /studies (read by hand to accept YAML too)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        spec = StudySpec.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(spec.pop("$defs", {}))
        components["StudySpec"] = spec
        ref = {"schema": {"$ref": "#/components/schemas/StudySpec"}}
        content = {"application/json": ref, "application/yaml": ref}
        schema["paths"]["/studies"]["post"]["requestBody"] = {"required": True, "content": content}
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(settings: Settings | None = None, executor: Executor | None = None) -> FastAPI:
    """The API over `settings` (default: the environment); `executor` defaults to Ray (`RayExecutor`)."""
    settings = settings or Settings()
    tokens = settings.tokens()  # checks PTCTL_API_TOKENS' format before anything starts
    if executor is None:
        from service.execution import RayExecutor

        executor = RayExecutor(settings)
    store = Store(settings.db_url)
    control = Control(store, executor, MlflowView(settings.tracking_uri), settings.data_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        store.migrate()
        from workers.tracking import prepare_store  # MLflow and torch load here, not in the first request

        try:
            prepare_store(settings.tracking_uri)
        except Exception:  # an MLflow server that is down: serve anyway, /readyz tells
            log.exception("the MLflow store %s could not be prepared", redact_uri(settings.tracking_uri))

        try:
            executor.connect()
            control.reconcile(startup=True)
        except Exception:  # serve anyway: /readyz tells, and the next start retries
            log.exception("Ray is not reachable yet; studies cannot start until it is")
        reconciler = Reconciler(control, settings.reconcile_s)
        reconciler.start()
        yield
        reconciler.stop()

    app = FastAPI(title="ptctl", version="0.1.0", lifespan=lifespan,
                  description="Hyperparameter-transfer studies (μP): submit a StudySpec, follow it, read its "
                              "report. Everything a study runs is logged to MLflow.")
    app.state.settings, app.state.control, app.state.tokens = settings, control, tokens
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    _errors(app)
    app.openapi = lambda: _openapi(app)
    return app
