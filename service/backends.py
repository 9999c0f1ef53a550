"""Where `ptctl`'s study commands run: `LocalBackend` (the study engine in this process) or `RemoteBackend`
(the HTTP API at `--server` / `$PTCTL_SERVER`, token `$PTCTL_TOKEN`).

Both run a spec to its end with a live bar per phase and give a finished study's Markdown report; the
remote one also lists, shows, cancels and resumes the server's studies. Heavy modules (the driver, Ray,
MLflow, httpx) are imported by the method that needs them, so `ptctl report ID` reads a file and no more.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.terminal import progress_bar, usage_error

if TYPE_CHECKING:
    from service.client import Client
    from service.schemas import StudyDetail
    from studies.spec import StudySpec

class Backend(Protocol):
    def run(self, spec: StudySpec, study_id: str | None = None) -> int:
        """Run (or submit) `spec` and follow it to its end; the command's exit code."""
        ...

    def report(self, study_id: str) -> str:
        """A finished study's report (Markdown)."""
        ...


# ---------------------------------------------------------------------------------------------- local
class LocalBackend:
    """The study engine (`workers.driver.run_study`) in this process, on the data directory's studies."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def file(self, study: str, name: str) -> Path:
        """`artifacts/<name>` of a study in the data directory, or an error listing the known studies."""
        from workers.folder import StudyFolder, studies_dir

        path = StudyFolder(study).artifact(name)
        if not path.exists():
            known = StudyFolder.known()
            raise usage_error(f"no {name} for study {study!r} in {studies_dir()} (known studies: {known}); "
                              "run it first")
        return path

    def report(self, study_id: str) -> str:
        return self.file(study_id, "report.md").read_text()

    def run(self, spec: StudySpec, study_id: str | None = None) -> int:
        state = self._run_with_progress(spec, study_id)
        self.summary(spec, state)
        return 0

    def _run_with_progress(self, spec: StudySpec, study_id: str | None) -> Any:
        from workers.driver import run_study

        with progress_bar(self.console) as bar:
            tasks: dict[str, Any] = {}

            def on_event(kind: str, data: dict[str, Any]) -> None:
                phase = data.get("phase", "")
                if kind == "phase_start":
                    tasks[phase] = bar.add_task(phase, total=data["trials"], note="")
                elif kind == "trial_done" and phase in tasks:
                    loss = data.get("eval_loss")
                    note = f"last: {data['status']}" + (f" {loss:.4f}" if isinstance(loss, float) else "")
                    bar.update(tasks[phase], advance=1, note=note)
                elif kind == "phase_done" and phase in tasks:
                    bar.update(tasks[phase], completed=bar.tasks[tasks[phase]].total, note="done")
                elif kind == "phase_skipped":
                    self.console.print(f"{phase}: already done, skipped")
                elif kind in ("recovered", "note"):
                    self.console.print(f"[yellow]note:[/] {data['error']}", soft_wrap=True)

            return run_study(spec, study_id, on_event)

    def summary(self, spec: StudySpec, state: Any) -> None:
        """The study's story in the terminal (`service.summary`), whichever phases it ran."""
        from service.summary import StudyView, print_summary
        from workers.folder import StudyFolder
        from workers.tracker import mlflow_installed

        runs: dict[str, str] = {}
        link = None
        if mlflow_installed():  # the local runner runs without it
            from workers.mlflow_tracker import Tracker

            tracker = Tracker(spec.experiment_name(), spec.resources.tracking.tracking_uri)
            runs = {r.data.tags.get("trial_key"): r.info.run_id
                    for r in tracker.runs(state.study_id, "trial", state.instance)}
            link = tracker.runs_link()
        view = StudyView(spec=spec, state=state, folder=StudyFolder(state.study_id), runs=runs, runs_link=link)
        print_summary(self.console, view)


# --------------------------------------------------------------------------------------------- remote
class RemoteBackend:
    """The ptctl API through `service.client.Client` (errors: `ApiError`, one line each)."""

    def __init__(self, server: str | None, console: Console) -> None:
        self.server, self.console = server, console
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            from service.client import Client

            self._client = Client(self.server)
        return self._client

    def report(self, study_id: str) -> str:
        return self.client.report(study_id).markdown

    def run(self, spec: StudySpec, study_id: str | None = None, watch: bool = True,
            idempotency_key: str | None = None) -> int:
        if study_id is not None:
            raise usage_error("the server names its studies: drop --study-id, or resume one with "
                              "`ptctl study resume ID`")
        study = self.client.submit(spec, idempotency_key)
        self.console.print(f"submitted study [bold]{study.id}[/] to {self.client.server} ({study.status})")
        return self.watch(study.id) if watch else 0

    def watch(self, study_id: str, interval: float = 2.0) -> int:
        """Follow a study with a live progress bar per phase until it stops; 0 if it succeeded."""
        import time

        from studies.status import PhaseStatus, StudyStatus

        try:
            with progress_bar(self.console) as bar:
                tasks: dict[str, Any] = {}
                while True:
                    study = self.client.get(study_id)
                    for phase, p in study.progress.items():
                        if p.status == PhaseStatus.PENDING.value and phase not in tasks:
                            continue
                        if phase not in tasks:
                            tasks[phase] = bar.add_task(phase, total=p.planned, note="")
                        best = f", best {p.best_eval_loss:.4f}" if p.best_eval_loss is not None else ""
                        note = f"{p.running} running, {p.failed} failed, {p.diverged} diverged{best}"
                        bar.update(tasks[phase], total=p.planned, completed=p.done + p.failed + p.diverged,
                                   note=note)
                    if study.status not in (StudyStatus.PENDING, StudyStatus.RUNNING):
                        break
                    time.sleep(interval)
        except KeyboardInterrupt:
            self.console.print(f"stopped watching; the study goes on: ptctl study show {study_id} --watch")
            return 130
        self.show(study)  # its verdicts too: the certificate's sentence among them
        return 0 if study.status == StudyStatus.SUCCEEDED else 1

    def show(self, study: StudyDetail) -> None:
        """Status, progress per phase, tuned hparams, each finished phase's verdict and MLflow ids of a study."""
        from service.verdicts import verdict_lines

        self.console.print(f"study [bold]{study.id}[/]: {study.status}"
                           + (f" (phase {study.phase})" if study.phase else "")
                           + (f" — {study.error}" if study.error else ""))
        table = Table(title="progress")
        for col in ("phase", "status", "planned", "done", "running", "failed", "diverged", "best eval loss"):
            table.add_column(col, justify="left" if col in ("phase", "status") else "right")
        for phase, p in study.progress.items():
            best = f"{p.best_eval_loss:.4f}" if p.best_eval_loss is not None else "—"
            table.add_row(phase, p.status, str(p.planned if p.planned is not None else "?"), str(p.done),
                          str(p.running), str(p.failed), str(p.diverged), best)
        self.console.print(table)
        if study.best_hparams:
            self.console.print("tuned hparams: " + ", ".join(f"{k}={v:.4g}" for k, v in study.best_hparams.items()))
        if lines := verdict_lines(study.verdicts):
            self.console.print("verdicts:\n" + "\n".join(f"  {escape(line)}" for line in lines), soft_wrap=True)
        m = study.mlflow
        self.console.print(f"MLflow: {m.tracking_uri}, experiment {m.experiment!r}"
                           + (f" (id {m.experiment_id}), study run {m.runs.get('study')}" if m.experiment_id else "")
                           + (f"\n  {m.links['study']}" if "study" in m.links else ""), soft_wrap=True)
