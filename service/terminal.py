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
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# piped or logged output gets wide lines, not rich's 80 columns: a run id or a path cut short is lost
PIPED_WIDTH = 200
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH)


def usage_error(message: str) -> Exception:
    """A mistake in the command line or the files it names (a `ConfigError`); printed without a traceback."""
    from workers.errors import ConfigError

    return ConfigError(message)


def progress_bar(out: Console) -> Progress:
    """One bar per phase: name, bar, trials done of planned, elapsed time, and a note."""
    return Progress(TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[note]}"), console=out)


def validation_lines(exc: Exception) -> str:
    """A pydantic `ValidationError` as one `path: message` line per field."""
    return "\n".join(f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                     for e in exc.errors())  # type: ignore[attr-defined]


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
