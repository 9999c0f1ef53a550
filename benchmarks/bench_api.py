"""API latency under a bounded loopback load while a study runs: p50/p90/p99 of GET /studies/{id} and POST /studies.

    python3 benchmarks/bench_api.py                      # starts its own stack in a temp data dir (~2 min)
    python3 benchmarks/bench_api.py --server http://127.0.0.1:8000 --token "$PTCTL_TOKEN"   # an API you run

Own stack: `ptctl serve` on a free 127.0.0.1 port with the embedded defaults (Ray head with
`--ray-cpus` CPUs, MLflow and the store on SQLite), stopped and deleted at the end with its Ray head.
Steps: submit the tiny catalog study and wait until its tune trials train; then `--gets` requests
of GET /studies/{id} from `--concurrency` threads (the read target is p99 < 50 ms); then `--posts`
sequential POST /studies of a valid spec, each cancelled right after (untimed) so no extra study
runs. Every loop is bounded in count and by `--max-seconds`; only 127.0.0.1 is ever contacted.
Prints a Markdown table (and the machine's load); `--json OUT` keeps the raw latencies.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._data import link_corpora  # noqa: E402
from service import ray_head  # noqa: E402
from studies import load_catalog  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def start_stack(data_dir: Path, ray_cpus: int) -> tuple[subprocess.Popen, str]:
    link_corpora(data_dir)  # the shared corpus cache, filled first (a fresh machine's ~/.ptctl is empty)
    port = _free_port()
    env = {**os.environ, "PTCTL_DATA_DIR": str(data_dir), "PTCTL_RAY_NUM_CPUS": str(ray_cpus), "RAY_ADDRESS": "",
           "MLFLOW_TRACKING_URI": "", "PTCTL_API_TOKENS": ""}
    log = open(data_dir / "api.log", "w")  # noqa: SIM115 (the server owns it until the end)
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"ptctl serve exited; see {data_dir / 'api.log'}")
        try:
            return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    _wait(ready, 240, "ptctl serve")
    return proc, url


def timed(client: httpx.Client, method: str, path: str, **kwargs) -> tuple[float, int]:
    start = time.perf_counter()
    response = client.request(method, path, **kwargs)
    return (time.perf_counter() - start) * 1000, response.status_code


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def load_gets(url: str, headers: dict, study_id: str, n: int, concurrency: int, max_s: float) -> dict:
    deadline = time.time() + max_s

    def worker(count: int) -> list[tuple[float, int]]:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            return [timed(client, "GET", f"/studies/{study_id}") for _ in range(count) if time.time() < deadline]

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = [r for chunk in pool.map(worker, [n // concurrency] * concurrency) for r in chunk]
    wall = time.perf_counter() - start
    return {"latencies": [r[0] for r in results], "errors": sum(r[1] != 200 for r in results), "wall_s": wall}


def load_posts(url: str, headers: dict, n: int, max_s: float) -> dict:
    spec = load_catalog("tiny").as_dict()
    latencies, errors, deadline = [], 0, time.time() + max_s
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        start = time.perf_counter()
        for i in range(n):
            if time.time() > deadline:
                break
            body = json.dumps(spec | {"name": "bench-post", "description": f"bench {i}"})
            t0 = time.perf_counter()
            response = client.post("/studies", content=body, headers={"Content-Type": "application/json"})
            latencies.append((time.perf_counter() - t0) * 1000)
            errors += response.status_code != 201
            if response.status_code == 201:
                client.post(f"/studies/{response.json()['id']}/cancel")  # untimed: no extra study runs
        wall = time.perf_counter() - start
    return {"latencies": latencies, "errors": errors, "wall_s": wall}


def row(name: str, concurrency: int, result: dict) -> str:
    lat = result["latencies"]
    return (f"| {name} | {len(lat)} | {concurrency} | {statistics.median(lat):.1f} | {pct(lat, 90):.1f} | "
            f"{pct(lat, 99):.1f} | {max(lat):.1f} | {len(lat) / result['wall_s']:.0f} | {result['errors']} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", default=None, help="an API to measure (default: start one in a temp data dir)")
    p.add_argument("--token", default=os.environ.get("PTCTL_TOKEN"), help="admin token (default: $PTCTL_TOKEN)")
    p.add_argument("--gets", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--posts", type=int, default=20)
    p.add_argument("--ray-cpus", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=120, help="cap on each load loop")
    p.add_argument("--json", default=None, help="write raw latencies and the environment here")
    args = p.parse_args()
    if args.server and not args.server.startswith(("http://127.", "http://localhost", "http://[::1]")):
        raise SystemExit("--server must be a loopback address (this benchmark never loads another machine)")

    proc, data_dir = None, None
    url = args.server
    if url is None:
        data_dir = Path(tempfile.mkdtemp(prefix="ptctl-bench-"))
        proc, url = start_stack(data_dir, args.ray_cpus)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            spec = load_catalog("tiny").as_dict() | {"name": "bench-running", "description": str(time.time())}
            study = client.post("/studies", json=spec).raise_for_status().json()["id"]
            _wait(lambda: client.get(f"/studies/{study}").json()["progress"]["tune"]["running"] > 0, 300,
                  "the study's tune trials to train")
            load_before = os.getloadavg()
            gets = load_gets(url, headers, study, args.gets, args.concurrency, args.max_seconds)
            running_after_gets = client.get(f"/studies/{study}").json()["status"]
            posts = load_posts(url, headers, args.posts, args.max_seconds)
            load_after = os.getloadavg()
            client.post(f"/studies/{study}/cancel")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            ray_head.stop(data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)

    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; study was {running_after_gets} during the GETs\n")
    print("| request | n | concurrency | p50 ms | p90 ms | p99 ms | max ms | req/s | non-2xx |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(row("GET /studies/{id}", args.concurrency, gets))
    print(row("POST /studies", 1, posts))
    if args.json:
        Path(args.json).write_text(json.dumps({"gets": gets, "posts": posts, "load": [load_before, load_after],
                                               "args": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
