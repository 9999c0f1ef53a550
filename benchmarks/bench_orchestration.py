"""Orchestration overhead of a tune phase: wall time / (Σ trial train time / concurrency).

Runs the tiny catalog study's tune phase with 16 trials (ASHA off, so every trial trains its full
budget) through the real engine (Ray Tune, Optuna, MLflow on SQLite) in a fresh data directory,
`--repeats` times, and prints the median ratio and the per-trial fixed cost,

    fixed cost per trial = (wall − Σ train / concurrency) · concurrency / trials,

the time a trial slot spends on anything but training (scheduling, actor reset, TPE's suggestion,
reporting, checkpoints, MLflow writes). Ray's start-up is excluded (it happens once per process).
Targets on 2 cores: ratio ≤ 1.10 with 6-s trials (`--steps 200`), ≤ 1.5 with 0.5-s trials (30 steps).
The load average is printed with every repeat: the machine must be otherwise quiet for the numbers
to mean much.

    python benchmarks/bench_orchestration.py --repeats 3              # 30-step trials
    python benchmarks/bench_orchestration.py --repeats 3 --steps 200  # ≈ 6-s trials
    python benchmarks/bench_orchestration.py --quick                  # 1 repeat of 4 trials (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _data import link_corpora  # benchmarks/_data.py: the shared corpus cache, filled first


def one_run(trials: int, seed: int, steps: int | None = None, checkpoint_every_s: float | None = None) -> dict:
    from studies import load_catalog
    from studies.phases import PHASES
    from studies.spec import StudySpec
    from workers.driver import StudyDriver
    from workers.ray_runner import ensure_ray

    data = load_catalog("tiny").as_dict()
    data["tune"].update(num_trials=trials, seed=seed,  # a new seed: an identical tune phase would be reused
                        asha={"enabled": False, "grace_steps": 10, "reduction_factor": 3})
    data["verify"] = None
    if steps:
        data["train"]["steps"] = steps
    if checkpoint_every_s is not None:
        data["resources"]["checkpoint_every_s"] = checkpoint_every_s
    spec = StudySpec.model_validate(data)
    ensure_ray()
    driver = StudyDriver(spec, study_id=f"bench-{time.time_ns()}")
    driver.state.runs["study"] = driver.tracker.study_run(driver.study_id, {})
    load = os.getloadavg()[0]
    start = time.perf_counter()
    driver._run_phase(PHASES["tune"])
    wall = time.perf_counter() - start
    table = driver.table("tune")
    c, busy = spec.tune.max_concurrent, table.wall_time_s.sum()
    out = {"wall_s": wall, "trial_sum_s": busy, "ratio": wall / (busy / c), "trials": len(table),
           "fixed_ms": 1000 * (wall - busy / c) * c / len(table), "load_before": load,
           "load_after": os.getloadavg()[0]}
    inside = _trainable_spans(driver.dir / "ray", driver.study_id)
    if inside:  # per trial: in the trainable but not training (spec, model, first data load), and outside any
        # trainable (actor start or reset, Tune's scheduling, TPE, result processing): the fixed cost split in two
        n = len(table)
        out.update(in_trainable_ms=1000 * (inside - busy) / n, outside_ms=1000 * (wall * c - inside) / n)
    return out


def _trainable_spans(storage: Path, study_id: str) -> float:
    """Σ over trials of the time their trainable ran (entered → left, from each trial's final result)."""
    from ray.tune import ExperimentAnalysis

    analysis = ExperimentAnalysis(str(storage / f"{study_id}.tune"))
    return sum(t.last_result["trainable_left"] - t.last_result["trainable_entered"] for t in analysis.trials
               if "trainable_left" in (t.last_result or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=None, help="steps per trial (default: the tiny spec's 30)")
    parser.add_argument("--checkpoint-every-s", type=float, default=None,
                        help="resources.checkpoint_every_s (default: the spec's; 0: a checkpoint at every evaluation)")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 4 trials: checks it runs, measures little")
    parser.add_argument("--json", default=None, help="write the runs here")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.trials = 1, 4
    tmp = link_corpora(Path(tempfile.mkdtemp(prefix="ptctl-bench-")))
    os.environ["PTCTL_DATA_DIR"] = str(tmp)  # before Ray starts: its workers inherit it
    runs = [one_run(args.trials, seed, args.steps, args.checkpoint_every_s) for seed in range(args.repeats)]
    print("| run | trials | wall s | Σ trial train s | ratio | fixed cost / trial ms (in trainable + outside) "
          "| load avg (1 min) before/after |")
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs):
        split = f" ({r['in_trainable_ms']:.0f} + {r['outside_ms']:.0f})" if "in_trainable_ms" in r else ""
        print(f"| {i} | {r['trials']} | {r['wall_s']:.1f} | {r['trial_sum_s']:.1f} | {r['ratio']:.2f} | "
              f"{r['fixed_ms']:.0f}{split} | {r['load_before']:.2f} / {r['load_after']:.2f} |")
    print(f"median ratio: {statistics.median(r['ratio'] for r in runs):.2f}; median fixed cost per trial: "
          f"{statistics.median(r['fixed_ms'] for r in runs):.0f} ms (targets: ratio <= 1.5 at 30 steps, "
          "<= 1.10 at 200 steps)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
