"""The FastAPI application: `create_app(settings)`; `ptctl serve` runs it under uvicorn.

Start-up (lifespan): migrate the store → create and migrate the MLflow store (so studies started together do not
race to) → connect to Ray (a failure is logged, `/readyz` reports it, and the next request that needs Ray
retries) → reconcile studies an earlier API process left → start the reconciler thread. Shutting down stops only
that thread: drivers and the Ray head keep running. Middleware answers oversized request heads with 431 before
anything reads them (auth included) and adds `Allow` to `OPTIONS` and 405. Errors are JSON `{"detail": ...}`;
the OpenAPI document lists exactly the ones each operation can answer (docs/control-plane.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import ERRORS, router
from service.control import Control, DriverRunning, ExecutionUnavailable, Executor, Reconciler
from service.field_errors import as_json, field_problems
from service.intake import Parser
from service.progress import MlflowView, redact_uri
from service.ray_head import head_env
from service.schemas import Error
from service.settings import Settings
from service.store import IdempotencyConflict, IllegalTransition, NotFound, Store
from studies.spec import StudySpec
from workers.door import Door

log = logging.getLogger(__name__)


class HeaderLimit:
    """431 for a request whose line and headers exceed `max_bytes`, before anything reads them (auth included).
    Under `ptctl serve` the HTTP parser refuses far larger heads first (`service.server`)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string", b"")) + 16
            size += sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.max_bytes:
                detail = (f"request headers over {self.max_bytes} bytes (PTCTL_MAX_HEADER_BYTES): send fewer or "
                          "shorter headers")
                return await JSONResponse({"detail": detail}, 431)(scope, receive, send)
        await self.app(scope, receive, send)


def flat_routes(routes: list[BaseRoute]) -> list[BaseRoute]:
    """Every route, those of included routers too (FastAPI keeps an included router as one entry; ours are
    included without a prefix)."""
    flat: list[BaseRoute] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        flat += flat_routes(inner.routes) if inner is not None else [route]
    return flat


class AllowedMethods:
    """`OPTIONS` on a path answers 204 with `Allow` listing every method of the path; so does a 405 (Starlette
    lists only the methods of the first route that matched the path)."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app, self.routes = app, flat_routes(routes)

    def _allowed(self, scope: Scope) -> list[str]:
        methods = {m for r in self.routes if (ms := getattr(r, "methods", None)) and r.matches(scope)[0] != Match.NONE
                   for m in ms}
        return sorted(methods | {"OPTIONS"}) if methods else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        allowed = self._allowed(scope)
        if scope["method"] == "OPTIONS" and allowed:
            return await Response(status_code=204, headers={"Allow": ", ".join(allowed)})(scope, receive, send)

        async def send_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405 and allowed:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", ", ".join(allowed).encode())]}
            await send(message)

        await self.app(scope, receive, send_allow)


def _errors(app: FastAPI) -> None:
    def handler(code: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def respond(_: Request, exc: Exception) -> JSONResponse:
            detail = f"no study {exc.args[0]!r}: list them with GET /studies" if code == 404 else str(exc)
            return JSONResponse({"detail": detail}, code)

        return respond

    app.add_exception_handler(NotFound, handler(404))
    for exc in (IllegalTransition, IdempotencyConflict, DriverRunning):
        app.add_exception_handler(exc, handler(409))
    app.add_exception_handler(ExecutionUnavailable, handler(503))

    async def invalid(_: Request, exc: Exception) -> JSONResponse:  # a query's 422 in the words of a spec's
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        return JSONResponse({"detail": as_json(field_problems(errors), prefix=())}, 422)

    app.add_exception_handler(RequestValidationError, invalid)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """OpenAPI with the `StudySpec` request body of POST /studies and POST /plans (read by hand to accept YAML
    too)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        spec = StudySpec.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(spec.pop("$defs", {}))
        components["StudySpec"] = spec
        ref = {"schema": {"$ref": "#/components/schemas/StudySpec"}}
        content = {"application/json": ref, "application/yaml": ref}
        for path in ("/studies", "/plans"):
            schema["paths"][path]["post"]["requestBody"] = {"required": True, "content": content}
        components["Error"] = Error.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(components["Error"].pop("$defs", {}))
        _error_responses(app, schema)
        app.openapi_schema = schema
    return app.openapi_schema


def _error_responses(app: FastAPI, schema: dict[str, Any]) -> None:
    """Each operation lists exactly the errors it can answer: its own (`service.api.errors`), 431 everywhere,
    401/403 only when tokens are configured, and no 422 where FastAPI assumes one that cannot happen (a path
    parameter that is any text)."""
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for route in flat_routes(app.routes):
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in route.methods or ():
            responses = schema["paths"][route.path_format][method.lower()]["responses"]
            declared = {str(code) for code in route.responses}
            for code in [c for c in responses if c in ("401", "403", "422") and c not in declared]:
                del responses[code]
            for code in [c for c in responses if c in ("401", "403") and not app.state.tokens]:
                del responses[code]
            responses["431"] = {"description": ERRORS[431], "content": ref}


def create_app(settings: Settings | None = None, executor: Executor | None = None) -> FastAPI:
    """The API over `settings` (default: the environment); `executor` defaults to Ray (`RayExecutor`)."""
    settings = settings or Settings()
    tokens = settings.tokens()  # checks PTCTL_API_TOKENS' format before anything starts
    if executor is None:
        from service.execution import RayExecutor

        executor = RayExecutor(settings)
    store = Store(settings.db_url)
    control = Control(store, executor, MlflowView(settings.tracking_uri), settings.data_dir)
    parser = Parser(settings.limits)
    # the model check's child sees what Ray's workers see: not the API's tokens or database URL
    door = Door(settings.door_memory_mb * 2**20, settings.door_timeout_s, head_env(os.environ))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store.migrate()
        from workers.mlflow_tracker import prepare_store  # MLflow and torch load here, not in the first request

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
        parser.close()
        door.close()

    app = FastAPI(title="ptctl", version="0.1.0", lifespan=lifespan,
                  description="Hyperparameter-transfer studies (μP): submit a StudySpec, follow it, read its "
                              "report. Everything a study runs is logged to MLflow.")
    app.state.settings, app.state.control, app.state.tokens, app.state.parser = settings, control, tokens, parser
    app.state.door = door
    app.include_router(router)
    app.add_middleware(AllowedMethods, routes=app.routes)
    app.add_middleware(HeaderLimit, max_bytes=settings.limits.header_bytes)  # outermost: before anything else
    _errors(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]  # FastAPI's way to customise the schema
    return app
