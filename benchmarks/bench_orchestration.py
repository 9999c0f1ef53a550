"""Orchestration overhead of a tune phase: wall time / (Σ trial train time / concurrency).

Runs the tiny catalog study's tune phase with 16 trials (ASHA off, so every trial trains its full
budget) through the real engine (Ray Tune, Optuna, MLflow on SQLite) in a fresh data directory,
`--repeats` times, and prints the median ratio. Ray's start-up is excluded (it happens once per
process); everything else — trial scheduling, actor start, data loading, reporting, MLflow
writes — counts as overhead. Target on 2 cores: ≤ 1.25.

    python benchmarks/bench_orchestration.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def one_run(trials: int, seed: int, steps: int | None = None) -> dict:
    from studies import load_catalog
    from studies.spec import StudySpec
    from workers.driver import StudyDriver
    from workers.ray_runner import ensure_ray

    data = load_catalog("tiny").as_dict()
    data["tune"].update(num_trials=trials, seed=seed,  # a new seed: an identical tune phase would be reused
                        asha={"enabled": False, "grace_steps": 10, "reduction_factor": 3})
    data["verify"] = None
    if steps:
        data["train"]["steps"] = steps
    spec = StudySpec.model_validate(data)
    ensure_ray()
    driver = StudyDriver(spec, f"bench-{time.time_ns()}")
    driver.state.runs["study"] = driver.tracker.study_run(driver.study_id, {})
    start = time.perf_counter()
    driver.phase_tune()
    wall = time.perf_counter() - start
    table = driver.table("tune")
    busy = table.wall_time_s.sum() / spec.tune.max_concurrent
    return {"wall_s": wall, "trial_sum_s": table.wall_time_s.sum(), "ratio": wall / busy, "trials": len(table)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=None, help="steps per trial (default: the tiny spec's 30)")
    args = parser.parse_args()
    shared = Path(os.environ.get("PTCTL_DATA_DIR") or Path.home() / ".ptctl")
    tmp = Path(tempfile.mkdtemp(prefix="ptctl-bench-"))
    (tmp / "corpora").symlink_to(shared / "corpora")
    os.environ["PTCTL_DATA_DIR"] = str(tmp)  # before Ray starts: its workers inherit it
    runs = [one_run(args.trials, seed, args.steps) for seed in range(args.repeats)]
    print("| run | trials | wall s | Σ trial train s | ratio |\n|---|---|---|---|---|")
    for i, r in enumerate(runs):
        print(f"| {i} | {r['trials']} | {r['wall_s']:.1f} | {r['trial_sum_s']:.1f} | {r['ratio']:.2f} |")
    overhead = statistics.median((r["wall_s"] - r["trial_sum_s"] / 2) / r["trials"] * 2 for r in runs)
    print(f"median ratio: {statistics.median(r['ratio'] for r in runs):.2f} (target <= 1.25); "
          f"median overhead per trial slot: {overhead:.2f} s")


if __name__ == "__main__":
    main()
