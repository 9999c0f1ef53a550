"""Open a finished study in the MLflow UI in a real headless browser, as a user would, and screenshot it.

    python tests/ui/mlflow_ui_check.py --data-dir DIR --out DIR [--study-id ID] [--server URL]

DIR is a ptctl data directory (`$PTCTL_DATA_DIR`) holding a finished study, e.g. after
`PTCTL_DATA_DIR=DIR ptctl study run studies/catalog/tiny.yaml`. The check:

1. starts `mlflow server` on 127.0.0.1 (a free port) on DIR's store, `sqlite:///DIR/mlflow.db` (ptctl's
   experiments keep their artifacts in `DIR/mlartifacts`), unless `--server` names a running one;
2. opens the link `ptctl study run` prints for the experiment's runs table (`Tracker.runs_link`, here on that
   server), checks that it opened the saved view `verdicts` with the verdict columns (`certified`, `upper_bound`,
   `n_better`, `centre_rank`, `best.<hparam>`, `base_width`, `target_widths`, `eval_loss`, ...), expands the
   study run and its phase runs (trial runs are named like `tune-03 lr=2.4e-2`), screenshot `runs_table.png`;
3. opens the study run's page: its description (the verdict sentences), params, metrics and tags,
   screenshot `study_run.png`;
4. opens its artifacts, `report.html`, checks that every figure in it loaded, screenshot `report.png`.

It prints what it checked and exits 0 when everything showed, 1 naming what did not.

Needs Playwright's Python package (`pip install playwright`) and a Chromium: it drives the system's
(`--chromium`, default `/usr/bin/chromium`, Debian's `chromium` package) and downloads no browser, so
`playwright install` is not needed. Chromium starts headless with the network features that stall it without a
network turned off. `tests/workers/test_study_engine.py::test_mlflow_ui_in_a_headless_browser` runs this
check on the tiny study the engine tests run, and skips when Playwright or Chromium is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 2560, "height": 1000}  # the runs table: wide enough for every verdict column of the tiny study
PAGE_VIEWPORT = {"width": 1700, "height": 1400}  # a run's page and its report
PHASES = ("tune", "transfer", "verify", "validate", "compare")  # the phase runs' names
TIMEOUT_MS = 120_000  # a loaded 2-core machine takes tens of seconds for the first page


@dataclass
class UICheck:
    """What the browser saw: each page's text, the screenshots and what did not show as claimed."""

    runs_link: str = ""
    texts: dict[str, str] = field(default_factory=dict)
    screenshots: list[Path] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)  # report.html's figures: alt text → natural width
    problems: list[str] = field(default_factory=list)

    def expect(self, page: str, *needles: str) -> None:
        """Each needle (a string, or `re:<pattern>`) must be in the text of `page`."""
        text = self.texts.get(page, "")
        for needle in needles:
            found = re.search(needle[3:], text) if needle.startswith("re:") else needle in text
            if not found:
                self.problems.append(f"{page}: {needle!r} not shown")


def missing_requirements(chromium: str = CHROMIUM) -> str | None:
    """Why the check cannot run here (no Playwright, no Chromium), or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's Python package is not installed (pip install playwright)"
    if not (Path(chromium).is_file() and os.access(chromium, os.X_OK)):
        return f"no Chromium at {chromium} (Debian: apt-get install chromium)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def mlflow_server(data_dir: Path, timeout_s: float = 180) -> Iterator[str]:
    """`mlflow server` on `data_dir`'s store at a free loopback port, for as long as the block runs; its URL."""
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="mlflow-ui-"))  # the server's cwd: nothing lands in the caller's
    log = (workdir / "server.log").open("w")
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1", "--backend-store-uri", f"sqlite:///{data_dir.resolve() / 'mlflow.db'}",
               "--artifacts-destination", str(data_dir.resolve() / "mlartifacts")]
    server = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start ({' '.join(command)}); its log: "
                                   f"{(workdir / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
        yield url
    finally:
        os.killpg(server.pid, 15)  # the server and its workers: a session of their own
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _study(url: str, study_id: str | None):
    """The study run to look at (`study_id`'s, else the newest study run of any experiment) and its experiment."""
    from mlflow import MlflowClient

    client = MlflowClient(url)
    ids = [e.experiment_id for e in client.search_experiments()]
    query = "tags.kind = 'study'" + (f" and tags.study_id = '{study_id}'" if study_id else "")
    runs = client.search_runs(ids, filter_string=query, order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise SystemExit(f"no study run {'of ' + study_id + ' ' if study_id else ''}in the store at {url}")
    run = runs[0]
    return run, client.get_experiment(run.info.experiment_id)


def view_columns(experiment) -> list[str]:
    """The column names (`upper_bound`, `best.lr`) of the saved view `verdicts` ptctl keeps on the experiment."""
    sys.path.insert(0, str(ROOT))
    from workers.mlflow_tracker import VIEW_ID, VIEW_TAG

    saved = experiment.tags.get(VIEW_TAG + VIEW_ID)
    if not saved:
        return ["<the saved view 'verdicts'>"]  # reported as not shown
    columns = json.loads(json.loads(saved)["state"])["selectedColumns"]
    return [column.split(".", 1)[1].strip("`") for column in columns]


def _expand(page, run_name: str) -> None:
    """Click the expander beside a parent run's name in the runs table (its child runs show below it)."""
    cell = page.locator("a", has_text=re.compile(rf"^{re.escape(run_name)}$")).first.locator(
        "xpath=ancestor::div[contains(@class,'ag-cell')][1]")
    cell.locator("button").first.click()


def _table_text(page) -> str:
    """The runs table's text, every column of it: the grid renders only the columns in view (a wide saved view's
    last ones, `Description` among them, are off screen until scrolled to), so it is read at each horizontal scroll
    position and scrolled back."""
    scroller = ".ag-body-horizontal-scroll-viewport"
    texts = [page.inner_text("body")]
    width, view = page.evaluate(f"() => {{ const e = document.querySelector('{scroller}'); "
                                "return e ? [e.scrollWidth, e.clientWidth] : [0, 0]; }")
    for left in range(view, width, max(view // 2, 1)) if view else ():
        page.evaluate(f"() => {{ document.querySelector('{scroller}').scrollLeft = {left}; }}")
        page.wait_for_timeout(500)
        texts.append(page.inner_text("body"))
    if len(texts) > 1:
        page.evaluate(f"() => {{ document.querySelector('{scroller}').scrollLeft = 0; }}")
        page.wait_for_timeout(500)
    return "\n".join(texts)


def _close_assistant(page) -> None:
    """The MLflow Assistant panel, open by default, takes a third of the width: close it like a user would."""
    close = page.locator("button[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count():
        close.first.click()


def _report(page, result: UICheck, out: Path) -> None:
    """Open the study run's report in its artifact view: `report.html`, each figure of which must have loaded; a
    run without one gets `report.md`, whose figures MLflow's Markdown view leaves as text (`[tune](tune.png)`)."""
    html = page.get_by_text("report.html", exact=True).count() > 0
    page.get_by_text("report.html" if html else "report.md", exact=True).first.click()
    if html:
        root = page.frame_locator("iframe").first  # MLflow shows an HTML artifact in a sandboxed frame
        root.locator("h1").first.wait_for()
        images = root.locator("img")
        for i in range(images.count()):
            image = images.nth(i)
            image.scroll_into_view_if_needed()
            width = image.evaluate("e => e.complete ? e.naturalWidth : 0")
            result.figures[image.get_attribute("alt") or f"img{i}"] = int(width)
        top = root.locator("h2", has_text=re.compile(r"^(lr alignment|tune)")).first  # the first figure's section
        if top.count():
            top.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(1000)
        result.texts["report"] = root.locator("body").inner_text()
    else:
        page.get_by_role("heading", name=re.compile("^Study")).first.wait_for()
        page.wait_for_timeout(1000)
        result.texts["report"] = page.inner_text("body")
        result.problems.append("report: the study run has no report.html")
        for alt in re.findall(r"\[([^\]]+)\]\([^)\s]+\.(?:png|svg)\)", result.texts["report"]):
            result.figures[alt] = 0
    shot = out / "report.png"
    page.screenshot(path=shot)
    result.screenshots.append(shot)
    if not result.figures:
        result.problems.append("report: it shows no figure")
    result.problems += [f"report: figure {alt!r} did not render" for alt, w in result.figures.items() if not w]


def check_ui(url: str, out: Path, study_id: str | None = None, chromium: str = CHROMIUM) -> UICheck:
    """Open the study in the MLflow UI at `url`; screenshots go to `out`. Raises nothing for what is missing:
    `UICheck.problems` says it."""
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from workers.mlflow_tracker import Tracker

    out.mkdir(parents=True, exist_ok=True)
    result = UICheck()
    run, experiment = _study(url, study_id)
    tags, params = run.data.tags, run.data.params
    result.runs_link = Tracker(experiment.name, url).runs_link()
    hparams = [k for k in params if k.startswith("best.")]
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(TIMEOUT_MS)

            # 1. the runs table, as the printed link opens it
            page.goto(result.runs_link)
            page.get_by_role("link", name=run.info.run_name).first.wait_for()
            _close_assistant(page)
            _expand(page, run.info.run_name)
            page.get_by_role("link", name=re.compile(f"^({'|'.join(PHASES)})$")).first.wait_for()
            phases = [p for p in PHASES if page.get_by_role("link", name=p, exact=True).count()]
            for phase in phases:
                _expand(page, phase)
            if "tune" in phases:
                page.get_by_role("link", name=re.compile(r"^tune-\d\d")).first.wait_for()
            page.wait_for_timeout(1500)
            result.texts["runs_table"] = _table_text(page)
            shot = out / "runs_table.png"
            page.screenshot(path=shot)
            result.screenshots.append(shot)
            result.expect("runs_table", "verdicts", run.info.run_name, *phases, "Description", "base_width",
                          *(["best.lr"] if "best.lr" in params else []), *view_columns(experiment))
            if "certified" in tags:
                result.expect("runs_table", "certified", "upper_bound", "n_better", "centre_rank", tags["certified"])
            if "tune" in phases:
                result.expect("runs_table", r"re:tune-\d\d lr=\d\.\de-\d", "steps_done")
            if "transfer" in phases:
                result.expect("runs_table", "target_widths", "eval_loss")
            result.expect("runs_table", *(k for k in run.data.metrics if "_drift." in k))

            # 2. the study run's page (taller: its params under its metrics)
            page.set_viewport_size(PAGE_VIEWPORT)
            page.goto(f"{url}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
                      "?workflowType=machine_learning")
            page.get_by_text("Description", exact=True).first.wait_for()
            page.get_by_text("Parameters", exact=False).first.wait_for()
            page.wait_for_timeout(1500)
            _close_assistant(page)
            result.texts["study_run"] = page.inner_text("body")
            shot = out / "study_run.png"
            page.screenshot(path=shot, full_page=True)
            result.screenshots.append(shot)
            note = tags.get("mlflow.note.content", "")
            sentences = [s for s in re.split(r"(?<=\.)\s+", note) if s.startswith(("Tuned at", "Certificate:"))]
            result.expect("study_run", *(s[:60] for s in sentences), *hparams, "base_width",
                          *(k for k in ("upper_bound", "n_better", "centre_rank", "certified") if k in
                            {**run.data.metrics, **tags}))

            # 3. its report, with the figures inline
            page.goto(f"{url}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}/artifacts"
                      "?workflowType=machine_learning")
            page.locator("[data-testid='artifact-tree-node']").first.wait_for()
            _close_assistant(page)
            _report(page, result, out)
            result.expect("report", "tune", *(["verify", "certified"] if "certified" in tags else []))
        finally:
            browser.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, help="the ptctl data directory holding a finished study")
    parser.add_argument("--out", type=Path, required=True, help="where the screenshots go")
    parser.add_argument("--study-id", help="the study to look at (default: the newest study run)")
    parser.add_argument("--server", help="a running MLflow server to use instead of starting one on --data-dir")
    parser.add_argument("--chromium", default=CHROMIUM, help=f"the Chromium binary (default {CHROMIUM})")
    args = parser.parse_args(argv)
    missing = missing_requirements(args.chromium)
    if missing:
        print(f"cannot run: {missing}", file=sys.stderr)
        return 2
    if not args.server and not args.data_dir:
        parser.error("give --data-dir (a server is started on its store) or --server URL")

    def run(url: str) -> UICheck:
        return check_ui(url.rstrip("/"), args.out, args.study_id, args.chromium)

    if args.server:
        result = run(args.server)
    else:
        with mlflow_server(args.data_dir) as url:
            result = run(url)
    print(f"runs table link: {result.runs_link}")
    for shot in result.screenshots:
        print(f"screenshot: {shot} ({shot.stat().st_size // 1024} kB)")
    print("report figures: " + ", ".join(f"{alt} {width} px wide" for alt, width in result.figures.items()))
    for problem in result.problems:
        print(f"NOT SHOWN: {problem}")
    print("ok: the verdicts, the study run and its report show in the MLflow UI" if not result.problems else
          f"{len(result.problems)} thing(s) did not show as claimed")
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
