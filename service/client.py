"""A typed httpx client of the ptctl API (what the CLI's `--server` commands use).

    client = Client("http://127.0.0.1:8000", token=os.environ.get("PTCTL_TOKEN"))
    study = client.submit(spec)              # StudySummary
    client.get(study.id).progress["tune"]    # PhaseProgress

Every method returns a model of `service/schemas.py`; an HTTP error raises `ApiError` whose message
is the server's `detail` (422 field errors as `path: message` lines), a connection error one that
says how to start the server.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from service.field_errors import FieldProblem, as_lines
from service.schemas import Report, StudyDetail, StudyPage, StudySummary, TrialTable
from service.terminal import default_server
from studies.spec import StudySpec
from workers.errors import PtctlError

M = TypeVar("M", bound=BaseModel)


class ApiError(PtctlError):
    """An HTTP error of the API (or no answer); the message is the server's `detail`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text or response.reason_phrase
    if isinstance(detail, list):  # 422: one entry per field, shown as the local CLI shows them
        problems = [FieldProblem(tuple(e.get("loc", [])[1:]), str(e.get("msg")), str(e.get("type")))
                    for e in detail if isinstance(e, dict)]
        return "\n" + "\n".join(f"  {line}" for line in as_lines(problems))
    return str(detail)


class Client:
    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.server = (server or default_server()).rstrip("/")
        token = token if token is not None else os.environ.get("PTCTL_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def _call(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, f"cannot reach the ptctl server at {self.server} ({type(exc).__name__}): start it "
                              "with `ptctl serve`, or pass --server URL / set PTCTL_SERVER") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, f"{method} {path} → {response.status_code}: {_detail(response)}")
        return model.model_validate(response.json())

    def submit(self, spec: StudySpec, idempotency_key: str | None = None) -> StudySummary:
        headers = {"Content-Type": "application/yaml", **({"Idempotency-Key": idempotency_key}
                                                          if idempotency_key else {})}
        return self._call(StudySummary, "POST", "/studies", content=spec.to_yaml().encode(), headers=headers)

    def list(self, status: str | None = None, limit: int = 50, offset: int = 0) -> StudyPage:
        params = {"limit": limit, "offset": offset, **({"status": status} if status else {})}
        return self._call(StudyPage, "GET", "/studies", params=params)

    def get(self, study_id: str) -> StudyDetail:
        return self._call(StudyDetail, "GET", f"/studies/{study_id}")

    def trials(self, study_id: str) -> TrialTable:
        return self._call(TrialTable, "GET", f"/studies/{study_id}/trials")

    def report(self, study_id: str) -> Report:
        return self._call(Report, "GET", f"/studies/{study_id}/report")

    def cancel(self, study_id: str) -> StudySummary:
        return self._call(StudySummary, "POST", f"/studies/{study_id}/cancel")

    def resume(self, study_id: str) -> StudySummary:
        return self._call(StudySummary, "POST", f"/studies/{study_id}/resume")
