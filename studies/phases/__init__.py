"""A study's phases, one file each, registered in `PHASES`; and the study's typed state (`state.json`).

Each phase (`studies.phases.base.Phase`) plans its trials from the spec and the state, judges its trial table
into a typed result, states its verdict and tells it (report, summary); `workers/driver.py` runs them in
`phases_of(spec)` order (those a spec has: `Phase.present`). Adding a
phase is its file and one entry here (its order: the run's, the report's). A phase draws its figures through
`analysis.plot_*`, never importing a plot by name: that would load matplotlib in every trial process
(`workers.ray` imports the phases).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator

from studies.phases import compare, transfer, tune, validate, verify
from studies.phases.base import Phase, PhaseFailed, PhaseResult, Verdict
from studies.phases.compare import CompareResult
from studies.phases.transfer import TransferResult
from studies.phases.tune import TuneResult
from studies.phases.validate import ValidateResult
from studies.phases.verify import VerifyResult
from studies.spec import StudySpec
from studies.status import PhaseStatus, StudyStatus

R = TypeVar("R", bound=PhaseResult)

PHASES: dict[str, Phase] = {
    "tune": tune.PHASE,  # `TuneResult`: the winner, the centre of every later phase
    "transfer": transfer.PHASE,  # `TransferResult`: eval loss per width
    "verify": verify.PHASE,  # `VerifyResult`: the certificate
    "validate": validate.PHASE,  # `ValidateResult`: the optimum's drift per doubling of width
    "compare": compare.PHASE,  # `CompareResult`: every family at every budget
}

__all__ = ["PHASES", "CompareResult", "Phase", "PhaseFailed", "PhaseResult", "PhaseStatus", "StudyState",
           "TransferResult", "TuneResult", "ValidateResult", "Verdict", "VerifyResult", "phases_of"]


def phases_of(spec: StudySpec) -> list[str]:
    """The phases `spec` runs, in order (those of `PHASES` it has: `Phase.present`)."""
    return [name for name, phase in PHASES.items() if phase.present(spec)]


class StudyState(BaseModel):
    """`state.json`: how a study stands, rewritten atomically by its driver (`workers/driver.py`)."""

    model_config = ConfigDict(extra="forbid")

    study_id: str
    spec_hash: str
    status: StudyStatus = StudyStatus.RUNNING
    phases: dict[str, SerializeAsAny[PhaseResult]] = Field(default_factory=dict)  # each phase's typed record
    runs: dict[str, str] = Field(default_factory=dict)  # "study" | phase → MLflow run id
    instance: str | None = None  # tagged on every MLflow run of this study; None: a state from before it
    tracking_uri: str | None = None  # where the runs are (credentials redacted)
    error: str | None = None  # the one-line cause of `failed` / `interrupted`
    driver: dict[str, Any] | None = None  # the process running it: {"host", "pid"}

    @field_validator("phases", mode="before")
    @classmethod
    def _typed(cls, value: Any) -> Any:
        """Each phase's record as its phase's result type (a phase no longer registered: the base record)."""
        if not isinstance(value, dict):
            return value
        return {name: PHASES[name].result.model_validate(record) if name in PHASES and isinstance(record, dict)
                else record for name, record in value.items()}

    def done(self, phase: str) -> bool:
        record = self.phases.get(phase)
        return record is not None and record.done

    def result(self, phase: str, kind: type[R]) -> R | None:
        """The finished phase's result, typed; None if the phase is not done."""
        record = self.phases.get(phase)
        if record is None or not record.done:
            return None
        assert isinstance(record, kind), f"{phase}'s record is a {type(record).__name__}, not a {kind.__name__}"
        return record

    def centre(self) -> dict[str, float]:
        """The tune phase's winner: the centre of transfer, verify and validate."""
        tune = self.phases["tune"]
        assert isinstance(tune, TuneResult)
        return dict(tune.best_hparams)
