"""`ptctl`'s terminal: its one console, its progress bar and its error policy.

Error policy (`run_command`): ptctl's own errors (`workers.errors.PtctlError`: a bad command line, a config
that cannot work, the API's HTTP errors, a study that failed) and pydantic's `ValidationError` end the
command with one `error:` line naming the fix: exit code 1 for a study that ran and failed, 2 for anything
the user can fix before running. Every other exception is a bug and ends with its traceback.

Imports only rich and the standard library at module level: `ptctl --help` must stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.progress import Task

    from studies.spec import StudySpec

DEFAULT_SERVER = "http://127.0.0.1:8000"


def default_server() -> str:
    """The API the remote commands talk to: `$PTCTL_SERVER`, else the local default."""
    return os.environ.get("PTCTL_SERVER") or DEFAULT_SERVER


# piped or logged output gets wide lines, not rich's 80 columns: a run id or a path cut short is lost
PIPED_WIDTH = 200
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH)


def usage_error(message: str) -> Exception:
    """A mistake in the command line or the files it names (a `ConfigError`); printed without a traceback."""
    from workers.errors import ConfigError

    return ConfigError(message)


class TimeLeftColumn(TimeRemainingColumn):
    """rich's time remaining, fed by the trials done over the phase's whole elapsed time: elapsed × (planned − done)
    / done. rich's own rate spans only its first to its last update, which trials finishing in pairs make ≈ 0."""

    def render(self, task: Task) -> Text:
        if task.finished or not task.completed or task.total is None or task.elapsed is None:
            left = super().render(task)
        else:
            seconds = int(task.elapsed * (task.total - task.completed) / task.completed)
            left = Text(f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}", style="progress.remaining")
        return Text.assemble("left ", left)


def progress_bar(out: Console) -> Progress:
    """One bar per phase: name, bar, trials done of planned, elapsed time, time left, and a note."""
    return Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeLeftColumn(), TextColumn("{task.fields[note]}"), console=out)


def validation_lines(exc: Exception) -> str:
    """A pydantic `ValidationError` as one `path: message` line per field, in the API's words."""
    from service.field_errors import as_lines, field_problems

    return "\n".join(f"  {line}" for line in as_lines(field_problems(exc.errors())))  # type: ignore[attr-defined]


def invalid_input(exc: Exception, what: str, root: type[BaseModel], data: Any,
                  flags: Mapping[str, str] | None = None) -> Exception:
    """A `usage_error` for a `ValidationError` of `root` validating `data`: "`what`:" then one line per field
    (`service.field_errors`); `flags` maps a field to the flag that set it, and when every problem is a flag's,
    the lines alone (`--from-width -32: must be greater than 0`)."""
    from service.field_errors import as_lines, field_problems, flagged

    problems = field_problems(exc.errors(), root, data)  # type: ignore[attr-defined]
    lines = as_lines(problems, flags)
    if flags and flagged(problems, flags):
        return usage_error("\n  ".join(lines))
    return usage_error(f"{what}:\n" + "\n".join(f"  {line}" for line in lines))


def print_error(out: Console, message: str) -> None:
    out.print(f"[red]error:[/] {message}", soft_wrap=True)


def run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace, out: Console) -> int:
    """`func(args)` under the error policy above; its exit code."""
    from pydantic import ValidationError

    from workers.errors import PtctlError, StudyError

    try:
        return func(args)
    except StudyError as exc:  # recorded in state.json and on the MLflow runs by the driver
        print_error(out, exc.describe())
        return 1
    except PtctlError as exc:
        print_error(out, str(exc))
        return 2
    except ValidationError as exc:
        print_error(out, f"{exc.title} is not valid:\n{validation_lines(exc)}")
        return 2


def validated_spec(data: dict[str, Any], what: str, flags: dict[str, str] | None = None) -> StudySpec:
    """A `StudySpec` from plain data; a ValidationError becomes "`what`:" and one line per field path, or per flag
    for a field one of `flags` set (spec field → flag)."""
    from pydantic import ValidationError

    from studies.spec import StudySpec

    try:
        return StudySpec.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, what, StudySpec, data, flags) from None


def load_spec(path: str) -> StudySpec:
    """The study spec in YAML file `path`; a missing file or an invalid spec is one `error:` per problem."""
    import yaml

    if not Path(path).is_file():
        raise usage_error(f"no spec file {path}; give a study spec YAML (catalog: studies/catalog/*.yaml)")
    return validated_spec(yaml.safe_load(Path(path).read_text(encoding="utf-8")), f"{path} is not a valid study spec")
