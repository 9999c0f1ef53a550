"""ptctl's own errors, caught by type by the CLI (`service/terminal.py`); any other exception is a bug.

`PtctlError` messages say what to fix and show as one line without a traceback; `ConfigError` (also a
`ValueError`) is an input that cannot work. The driver turns every exception of a study into a `StudyError` after
recording it (`state.json`, the study and phase MLflow runs), so a caller never reads Ray's or MLflow's own:
`StudyFailed` (status `failed`, runs FAILED) when the study cannot finish as specified, `InfrastructureLost`
(status `interrupted`, runs KILLED; re-running resumes) when the machinery it ran on went away.
"""

from __future__ import annotations

from studies.status import StudyStatus

MAX_CAUSE = 500  # characters of a one-line cause


def message(exc: BaseException) -> str:
    """`str(exc)`, but a pydantic `ValidationError` as `Model: field: message; ...`, without pydantic's links to its
    docs (errors.pydantic.dev), which name no fix of ours."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return str(exc)
    problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
                for e in exc.errors(include_url=False)]
    return f"{exc.title}: {'; '.join(problems)}"


def one_line(exc: BaseException) -> str:
    """`Type: the message` on one line (`message`), at most MAX_CAUSE characters; ptctl's own errors, which name
    their fix, keep their text whole."""
    text = " ".join(message(exc).split()) or "(no message)"
    if isinstance(exc, PtctlError):
        return text
    line = f"{type(exc).__name__}: {text}"
    return line if len(line) <= MAX_CAUSE else line[:MAX_CAUSE - 1] + "…"


class PtctlError(Exception):
    """An error of ptctl's own, whose message names the fix; the CLI prints it as one line."""


class ConfigError(PtctlError, ValueError):
    """An input that cannot work: the message names the field (or file) and a value that would."""


class InputNotFound(ConfigError, FileNotFoundError):
    """A file or folder an input names does not exist (or holds nothing usable)."""


class StudyError(PtctlError):
    """A study that ended without succeeding; `status` is what `state.json` records."""

    status = StudyStatus.FAILED

    def __init__(self, message: str, study_id: str | None = None, phase: str | None = None) -> None:
        super().__init__(message)
        self.study_id, self.phase = study_id, phase

    def describe(self) -> str:
        """One line for the CLI: which study, where, why, and what to do."""
        where = f"study {self.study_id}" + (f" ({self.phase} phase)" if self.phase else "")
        return f"{where} {self.status}: {self}"


class StudyFailed(StudyError):
    """The study cannot finish as specified; fix the cause, then re-run (or use a new study id)."""


class InfrastructureLost(StudyError):
    """Ray (or another piece of infrastructure) went away; re-running the same command resumes."""

    status = StudyStatus.INTERRUPTED


class Interrupted(StudyError):
    """The study was stopped before a phase's trials had all run (Ctrl-C, SIGTERM); re-running resumes it."""

    status = StudyStatus.INTERRUPTED
