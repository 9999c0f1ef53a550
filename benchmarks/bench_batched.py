"""Trials per minute: K trials trained one by one, one per process, and as one batched model (`train_batch`).

K PT trial configs (μP, cpu_demo's arch: 2 channels, rank 8, 3 iterations, γ 2, base width 32; the built-in
Shakespeare corpus at 60k words, |V| 2000, seq 64; batch 16, eval every 25 steps on 2 batches) share width, steps
and seed and differ, as a verify phase's samples do, in lr (1e-2 · 2^u) and w_H (1 − 0.6·u), u spread over
(−0.5, 0.5). For each width and K, three modes:

- alone-in-process: `train_trial` on each config in turn, in this process (data prepared once);
- one-per-process: each config in a fresh `python -c` (interpreter start, torch import, data read from the
  on-disk cache, training); at most `--process-trials` of the K run and the time per trial is their mean;
- batched: `train_batch(configs)` once.

Each repeat runs the three in that order (paired in time); the table gives the medians over `--repeats` of the
seconds per trial, trials per minute, and batched's speed-up over each solo mode. Torch threads: `--threads`.

    python benchmarks/bench_batched.py                       # widths 32, 64, 128; K 1, 4, 16, 61; 50 steps
    python benchmarks/bench_batched.py --widths 64 --members 16 --repeats 5 --out /tmp/bench_batched.json
    python benchmarks/bench_batched.py --quick               # width 32, K 1 and 4, 5 steps, 1 repeat: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data import ROOT, link_corpora  # benchmarks/_data.py: the shared corpus cache, filled first

CHILD = """
import json, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from workers.train import train_trial
print(json.dumps({"train_s": train_trial(json.loads(sys.stdin.read())).wall_time_s}))
"""


def configs(width: int, k: int, steps: int) -> list[dict]:
    """K trial configs at `width` that differ in lr and w_H only."""
    from studies import load_catalog
    from studies.spec import DataSpec

    spec = load_catalog("cpu_demo")
    data = DataSpec(max_tokens=60_000, seq_len=64, vocab_size=2000).model_dump(mode="json")
    out = []
    for i in range(k):
        u = (i + 0.5) / k - 0.5
        cfg = spec.trial_config(width, {**spec.space.defaults(), "lr": 1e-2 * 2**u, "w_H": 1 - 0.6 * u}, 0, steps)
        cfg.update(data=data, batch_size=16, eval_every=25, eval_batches=2, device="cpu")
        out.append(cfg)
    return out


def alone(cfgs: list[dict]) -> tuple[float, int]:
    """Seconds per trial of `train_trial` on each config in turn, and how many did not complete."""
    from workers.train import train_trial

    start = time.perf_counter()
    results = [train_trial(cfg) for cfg in cfgs]
    return (time.perf_counter() - start) / len(cfgs), sum(r.status != "completed" for r in results)


def per_process(cfgs: list[dict], n: int, threads: int) -> tuple[float, float]:
    """Seconds per trial of a fresh process per config, over the first `n`, and the training time within it."""
    walls, trains = [], []
    for cfg in cfgs[:n]:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(threads)], input=json.dumps(cfg), cwd=ROOT,
                              capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if done.returncode:
            raise RuntimeError(f"the one-trial process failed:\n{done.stderr[-3000:]}")
        trains.append(json.loads(done.stdout.strip().splitlines()[-1])["train_s"])
    return statistics.mean(walls), statistics.mean(trains)


def batched(cfgs: list[dict]) -> tuple[float, int]:
    """Seconds per trial of one `train_batch` over the configs, and how many members did not complete."""
    from workers.batched import train_batch

    start = time.perf_counter()
    results = train_batch(cfgs)
    return (time.perf_counter() - start) / len(cfgs), sum(r.status != "completed" for r in results)


def row(width: int, k: int, args: argparse.Namespace) -> dict:
    cfgs = configs(width, k, args.steps)
    n = min(k, args.process_trials)
    runs: dict[str, list[float]] = {"alone": [], "process": [], "process_train": [], "batched": []}
    not_completed = 0
    for _ in range(args.repeats):
        s, bad = alone(cfgs)
        runs["alone"].append(s)
        wall, train = per_process(cfgs, n, args.threads)
        runs["process"].append(wall)
        runs["process_train"].append(train)
        b, bad_b = batched(cfgs)
        runs["batched"].append(b)
        not_completed += bad + bad_b
    med = {mode: statistics.median(v) for mode, v in runs.items()}
    return {"width": width, "k": k, "steps": args.steps, "process_trials_run": n, "not_completed": not_completed,
            "s_per_trial": {m: med[m] for m in ("alone", "process", "batched")},
            "process_train_s": med["process_train"],
            "trials_per_min": {m: 60 / med[m] for m in ("alone", "process", "batched")},
            "batched_vs_alone": med["alone"] / med["batched"], "batched_vs_process": med["process"] / med["batched"],
            "runs": runs, "load_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16, 61], help="K: trials per batch")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--process-trials", type=int, default=4, help="one-per-process trials run per repeat")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, here and in every child process")
    parser.add_argument("--quick", action="store_true", help="width 32, K 1 and 4, 5 steps, 1 repeat")
    parser.add_argument("--out", "--json", dest="out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.widths, args.members, args.steps, args.repeats = [32], [1, 4], 5, 1
    os.environ["PTCTL_DATA_DIR"] = str(link_corpora(Path(tempfile.mkdtemp(prefix="ptctl-bench-"))))
    import torch

    torch.set_num_threads(args.threads)
    warm = configs(args.widths[0], 2, 1)
    alone(warm[:1])  # builds the on-disk data cache and loads the data once for this process
    batched(warm)  # first-call costs (imports, allocator) kept out of the first row
    load = os.getloadavg()[0]
    rows = []
    for width in args.widths:
        for k in args.members:
            rows.append(row(width, k, args))
            r = rows[-1]
            print(f"width {width} K {k}: {r['s_per_trial']['alone']:.3f} / {r['s_per_trial']['process']:.3f} / "
                  f"{r['s_per_trial']['batched']:.3f} s per trial (alone / per process / batched)", flush=True)
    print(f"\n{args.steps} steps per trial, {args.threads} torch threads, median of {args.repeats} repeats; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after. One-per-process: at most "
          f"{args.process_trials} of the K trials run per repeat, the time per trial extrapolated from them.\n")
    print("| width | K | alone s/trial | per-process s/trial (run) | batched s/trial | trials/min alone / "
          "per-process / batched | batched vs alone | batched vs per-process |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, t = r["s_per_trial"], r["trials_per_min"]
        print(f"| {r['width']} | {r['k']} | {s['alone']:.3f} | {s['process']:.3f} ({r['process_trials_run']}) | "
              f"{s['batched']:.3f} | {t['alone']:.1f} / {t['process']:.1f} / {t['batched']:.1f} | "
              f"{r['batched_vs_alone']:.2f}× | {r['batched_vs_process']:.2f}× |")
    if any(r["not_completed"] for r in rows):
        print("\nsome trials did not complete (diverged): see not_completed in the JSON")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "torch": torch.__version__, "rows": rows},
                                             indent=2))


if __name__ == "__main__":
    main()
