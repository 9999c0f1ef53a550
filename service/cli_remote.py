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
from collections.abc import Callable

from rich.markup import escape
from rich.table import Table

from service.backends import RemoteBackend
from service.terminal import console, default_server, load_spec


def remote(args: argparse.Namespace) -> RemoteBackend:
    """The API at `--server` (else `$PTCTL_SERVER`, else the local default), printing to `ptctl`'s console."""
    return RemoteBackend(args.server, console)


# ---------------------------------------------------------------------------------- commands
def cmd_submit(args: argparse.Namespace) -> int:
    return remote(args).run(load_spec(args.file), watch=args.watch, idempotency_key=args.idempotency_key)


def cmd_list(args: argparse.Namespace) -> int:
    page = remote(args).client.list(args.status, args.limit, args.offset)
    table = Table(title=f"studies {args.offset + 1}–{args.offset + len(page.items)} of {page.total}")
    for col in ("id", "status", "phase", "created", "verdict", "error"):
        table.add_column(col)
    for s in page.items:
        table.add_row(s.id, s.status, s.phase or "", f"{s.created_at:%Y-%m-%d %H:%M:%S}",
                      escape(s.verdict.line) if s.verdict else "—", escape((s.error or "")[:60]))
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    backend = remote(args)
    if args.watch:
        return backend.watch(args.study)
    backend.show(backend.client.get(args.study))
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    rows = remote(args).client.trials(args.study).trials
    cols = ("trial_id", "phase", "width", "seed", "status", "eval_loss", "lr", "mlflow_run_id")
    table = Table(title=f"{len(rows)} trials of {args.study}")
    for col in cols:
        table.add_column(col, justify="right" if col in ("width", "seed", "eval_loss", "lr") else "left")
    for r in rows:
        table.add_row(*(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c) if r.get(c) is not None
                                                                             else "—") for c in cols))
    console.print(table)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    study = remote(args).client.cancel(args.study)
    console.print(f"study {study.id}: {study.status}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    backend = remote(args)
    study = backend.client.resume(args.study)
    console.print(f"study {study.id}: {study.status} (driver start {study.attempts})")
    return 0 if not args.watch else backend.watch(study.id)


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
def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                 study: argparse._SubParsersAction[argparse.ArgumentParser],
                 cmd_report: Callable[[argparse.Namespace], int]) -> None:
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
        s.set_defaults(func=func, remote=True)

    s = sub.add_parser("serve", help="run the API (uvicorn); settings from PTCTL_* variables")
    s.add_argument("--host", default=None, help="default: $PTCTL_HOST or 127.0.0.1")
    s.add_argument("--port", type=int, default=None, help="default: $PTCTL_PORT or 8000")
    s.set_defaults(func=cmd_serve)
    s = sub.add_parser("ray-head", help="the embedded Ray head that `ptctl serve` starts (outlives it)")
    s.add_argument("action", choices=["status", "stop"], help="stop also ends every study running on it")
    s.set_defaults(func=cmd_ray_head)
