"""`ptctl` as a client of the API, and `ptctl serve`.

    ptctl serve [--host H] [--port P]               the API under uvicorn (PTCTL_* settings)
    ptctl study submit FILE [--watch]               POST the spec; --watch follows it live
    ptctl study list [--status S]                   ptctl study show ID [--watch]
    ptctl study trials ID | report ID | cancel ID | resume ID
    ptctl transfer ... --server URL                 submit the derived spec instead of running it here
    ptctl ray-head status | stop                    the embedded Ray head `ptctl serve` started

The server is `--server URL`, else `$PTCTL_SERVER`, else http://127.0.0.1:8000; the token is
`$PTCTL_TOKEN` (never a flag: command lines are visible to every user of the machine).
"""

from __future__ import annotations

import argparse
import functools
import time

from rich.console import Console
from rich.markdown import Markdown
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.client import ApiError, Client, default_server
from service.schemas import StudyDetail

console = Console()
ACTIVE = ("pending", "running")


def _client(args: argparse.Namespace) -> Client:
    return Client(args.server)


def _print_detail(study: StudyDetail) -> None:
    console.print(f"study [bold]{study.id}[/]: {study.status}" + (f" (phase {study.phase})" if study.phase else "")
                  + (f" — {study.error}" if study.error else ""))
    table = Table(title="progress")
    for col in ("phase", "status", "planned", "done", "running", "failed", "diverged", "best eval loss"):
        table.add_column(col, justify="left" if col in ("phase", "status") else "right")
    for phase, p in study.progress.items():
        best = f"{p.best_eval_loss:.4f}" if p.best_eval_loss is not None else "—"
        table.add_row(phase, p.status, str(p.planned if p.planned is not None else "?"), str(p.done),
                      str(p.running), str(p.failed), str(p.diverged), best)
    console.print(table)
    if study.best_hparams:
        console.print("tuned hparams: " + ", ".join(f"{k}={v:.4g}" for k, v in study.best_hparams.items()))
    m = study.mlflow
    console.print(f"MLflow: {m.tracking_uri}, experiment {m.experiment!r}"
                  + (f" (id {m.experiment_id}), study run {m.runs.get('study')}" if m.experiment_id else ""))


def watch(client: Client, study_id: str, interval: float = 2.0) -> int:
    """Follow a study with a live progress bar per phase until it stops; 0 if it succeeded."""
    columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[note]}"))
    try:
        with Progress(*columns, console=console) as bar:
            tasks: dict[str, int] = {}
            while True:
                study = client.get(study_id)
                for phase, p in study.progress.items():
                    if p.status == "pending" and phase not in tasks:
                        continue
                    if phase not in tasks:
                        tasks[phase] = bar.add_task(phase, total=p.planned, note="")
                    best = f", best {p.best_eval_loss:.4f}" if p.best_eval_loss is not None else ""
                    note = f"{p.running} running, {p.failed} failed, {p.diverged} diverged{best}"
                    bar.update(tasks[phase], total=p.planned, completed=p.done + p.failed + p.diverged, note=note)
                if study.status not in ACTIVE:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        console.print(f"stopped watching; the study goes on: ptctl study show {study_id} --watch")
        return 130
    _print_detail(study)
    if study.status == "succeeded":
        cert = client.report(study_id).certificate
        if cert:
            console.print(f"[{'green' if cert.get('certified') else 'yellow'}]verify:[/] {cert.get('verdict')}")
    return 0 if study.status == "succeeded" else 1


def one_line_errors(func):
    """API errors end the command with their message (no traceback), like `ptctl`'s UsageError."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs) -> int:
        try:
            return func(*args, **kwargs)
        except ApiError as exc:
            console.print(f"[red]error:[/] {exc}")
            return 2

    return wrapper


@one_line_errors
def submit_and_watch(server: str | None, spec) -> int:
    """POST `spec` to `server` and follow it live (`ptctl transfer --server`)."""
    client = Client(server)
    study = client.submit(spec)
    console.print(f"submitted study [bold]{study.id}[/] to {client.server} ({study.status})")
    return watch(client, study.id)


# ---------------------------------------------------------------------------------- commands
@one_line_errors
def cmd_submit(args: argparse.Namespace) -> int:
    from service.cli import _load_spec

    client = _client(args)
    study = client.submit(_load_spec(args.file), args.idempotency_key)
    console.print(f"submitted study [bold]{study.id}[/] to {client.server} ({study.status})")
    return watch(client, study.id) if args.watch else 0


@one_line_errors
def cmd_list(args: argparse.Namespace) -> int:
    page = _client(args).list(args.status, args.limit, args.offset)
    table = Table(title=f"studies {args.offset + 1}–{args.offset + len(page.items)} of {page.total}")
    for col in ("id", "status", "phase", "created", "error"):
        table.add_column(col)
    for s in page.items:
        table.add_row(s.id, s.status, s.phase or "", f"{s.created_at:%Y-%m-%d %H:%M:%S}", (s.error or "")[:60])
    console.print(table)
    return 0


@one_line_errors
def cmd_show(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.watch:
        return watch(client, args.study)
    _print_detail(client.get(args.study))
    return 0


@one_line_errors
def cmd_trials(args: argparse.Namespace) -> int:
    rows = _client(args).trials(args.study).trials
    cols = ("trial_id", "phase", "width", "seed", "status", "eval_loss", "lr", "mlflow_run_id")
    table = Table(title=f"{len(rows)} trials of {args.study}")
    for col in cols:
        table.add_column(col, justify="right" if col in ("width", "seed", "eval_loss", "lr") else "left")
    for r in rows:
        table.add_row(*(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c) if r.get(c) is not None
                                                                             else "—") for c in cols))
    console.print(table)
    return 0


@one_line_errors
def cmd_report(args: argparse.Namespace) -> int:
    report = _client(args).report(args.study)
    console.print(Markdown(report.markdown) if args.render else report.markdown)
    return 0


@one_line_errors
def cmd_cancel(args: argparse.Namespace) -> int:
    study = _client(args).cancel(args.study)
    console.print(f"study {study.id}: {study.status}")
    return 0


@one_line_errors
def cmd_resume(args: argparse.Namespace) -> int:
    study = _client(args).resume(args.study)
    console.print(f"study {study.id}: {study.status} (driver start {study.attempts})")
    return 0 if not args.watch else watch(_client(args), study.id)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.app import create_app
    from service.logs import log_config
    from service.server import uvicorn_config
    from service.settings import Settings

    settings = Settings(**{k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None})
    settings.check_exposure()
    uvicorn.Server(uvicorn_config(create_app(settings), settings, log_config=log_config())).run()
    return 0


def cmd_ray_head(args: argparse.Namespace) -> int:
    from service import ray_head
    from service.settings import Settings

    data_dir = Settings().data_dir
    if args.action == "stop":
        stopped = ray_head.stop(data_dir)
        console.print("stopped the embedded Ray head" if stopped else "no embedded Ray head was running")
    else:
        head = ray_head.running(data_dir)
        console.print(f"embedded Ray head at {head.address} (process group {head.pgid}, files {head.temp_dir})"
                      if head else f"no embedded Ray head runs for {data_dir}")
    return 0


# ---------------------------------------------------------------------------------- parsers
def add_commands(sub, study) -> None:
    """Register the client commands under `ptctl study` (`study`) and the top-level ones (`sub`)."""
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument("--server", default=None, help=f"the API (default: $PTCTL_SERVER or {default_server()})")

    s = study.add_parser("submit", parents=[server], help="submit a spec file to the server")
    s.add_argument("file")
    s.add_argument("--watch", action="store_true", help="follow the study live until it stops")
    s.add_argument("--idempotency-key", default=None, help="retries with the same key never start a second study")
    s.set_defaults(func=cmd_submit)
    s = study.add_parser("list", parents=[server], help="list the server's studies, newest first")
    s.add_argument("--status", default=None, choices=["pending", "running", "succeeded", "failed", "cancelled",
                                                       "interrupted"])
    s.add_argument("--limit", type=int, default=50)
    s.add_argument("--offset", type=int, default=0)
    s.set_defaults(func=cmd_list)
    for name, func, text in (("show", cmd_show, "status, progress and MLflow ids of a study"),
                             ("trials", cmd_trials, "a study's trial table"),
                             ("report", cmd_report, "a finished study's Markdown report"),
                             ("cancel", cmd_cancel, "stop a study's Ray work (status cancelled)"),
                             ("resume", cmd_resume, "continue an interrupted, failed or cancelled study")):
        s = study.add_parser(name, parents=[server], help=text)
        s.add_argument("study", help="study id")
        if name in ("show", "resume"):
            s.add_argument("--watch", action="store_true", help="follow the study live until it stops")
        if name == "report":
            s.add_argument("--render", action="store_true", help="render the Markdown in the terminal")
        s.set_defaults(func=func)

    s = sub.add_parser("serve", help="run the API (uvicorn); settings from PTCTL_* variables")
    s.add_argument("--host", default=None, help="default: $PTCTL_HOST or 127.0.0.1")
    s.add_argument("--port", type=int, default=None, help="default: $PTCTL_PORT or 8000")
    s.set_defaults(func=cmd_serve)
    s = sub.add_parser("ray-head", help="the embedded Ray head that `ptctl serve` starts (outlives it)")
    s.add_argument("action", choices=["status", "stop"], help="stop also ends every study running on it")
    s.set_defaults(func=cmd_ray_head)
