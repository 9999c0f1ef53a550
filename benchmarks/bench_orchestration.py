"""Orchestration overhead of a tune phase: wall time / (Σ trial train time / concurrency).

Runs the tiny catalog study's tune phase with 16 trials (ASHA off, so every trial trains its full
budget) through the real engine (Ray Tune, Optuna, MLflow on SQLite) in a fresh data directory,
`--repeats` times, and prints the median ratio and the per-trial fixed cost,

    fixed cost per trial = (wall − Σ train / concurrency) · concurrency / trials,

the time a trial slot spends on anything but training (scheduling, actor reset, TPE's suggestion,
reporting, checkpoints, MLflow writes). Ray's start-up is excluded (it happens once per process).
It is split in two, from each trial's own clock (entered and left its trainable, its training time):
the phase's start, paid once per trial slot (Tune starts each phase's trial actors: a process, its
imports, the first trial's set-up), and the steady cost of every later trial on a reused actor
(the gap between one trial leaving and the next entering the same actor, plus its trainable's time
beyond training).
Targets on 2 cores: ratio ≤ 1.5 with 0.5-s trials and ≤ 1.05 with 6-s trials, a fixed cost ≤ 150 ms per
trial; the steps that make those durations depend on the machine (55 and 750 on the one in docs/LOG.md).
The load average is printed with every repeat: the machine must be otherwise quiet for the numbers
to mean much.

    python benchmarks/bench_orchestration.py --repeats 3              # the tiny spec's 30-step trials
    python benchmarks/bench_orchestration.py --repeats 3 --steps 750  # ≈ 6-s trials (7.5 s in docs/LOG.md)
    python benchmarks/bench_orchestration.py --quick                  # 1 repeat of 4 trials (a smoke run)
"""

from __future__ import annotations

import argparse
import itertools
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
    from workers.ray.cluster import ensure_ray

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
    start, started_at = time.perf_counter(), time.time()
    driver._run_phase(PHASES["tune"])
    wall = time.perf_counter() - start
    table = driver.table("tune")
    c, busy = spec.tune.max_concurrent, table.wall_time_s.sum()
    out = {"wall_s": wall, "trial_sum_s": busy, "ratio": wall / (busy / c), "trials": len(table),
           "fixed_ms": 1000 * (wall - busy / c) * c / len(table), "load_before": load,
           "load_after": os.getloadavg()[0]}
    spans = _trainable_spans(driver.dir / "ray", driver.study_id)
    if spans:  # per trial: in the trainable but not training (spec, model, first data load), and outside any
        # trainable (actor start or reset, Tune's scheduling, TPE, result processing): the fixed cost split in two
        n, inside = len(table), sum(left - entered for _, entered, left, _ in spans)
        out.update(in_trainable_ms=1000 * (inside - busy) / n, outside_ms=1000 * (wall * c - inside) / n,
                   **phase_start_and_steady(spans, started_at))
    return out


def _trainable_spans(storage: Path, study_id: str) -> list[tuple[int, float, float, float]]:
    """Each trial's (actor pid, entered, left its trainable, training s), from its final result."""
    from ray.tune import ExperimentAnalysis

    from workers.ray.trainable import REPORTS
    from workers.report import load_reports

    analysis = ExperimentAnalysis(str(storage / f"{study_id}.tune"))
    return [(r["pid"], r["trainable_entered"], r["trainable_left"], load_reports(r[REPORTS])[0].wall_time_s or 0.0)
            for r in (t.last_result or {} for t in analysis.trials) if "trainable_left" in r]


def phase_start_and_steady(spans: list[tuple[int, float, float, float]], started_at: float) -> dict[str, float]:
    """The fixed cost's two parts. `start_s`: median over trial actors of the phase's start to its first trial's
    training (the actor's process and imports, then that trial's set-up beyond a later trial's); `steady_ms`: median
    over every later trial of the gap since the actor's previous trial left plus its trainable's time beyond
    training (reset, Tune's scheduling, TPE, reporting)."""
    by_actor: dict[int, list[tuple[float, float]]] = {}  # each actor's trials in order: (left, training s)
    for pid, _, left, train in sorted(spans, key=lambda s: s[1]):  # by when each entered
        by_actor.setdefault(pid, []).append((left, train))
    # a trial's time not training: since the actor's previous trial left (for its first, since the phase's start)
    steady = [1000 * (left - train - before) for trials in by_actor.values()
              for (before, _), (left, train) in itertools.pairwise(trials)]
    steady_ms = statistics.median(steady) if steady else float("nan")
    extra = steady_ms / 1000 if steady else 0.0  # a later trial's own cost, taken off the first's
    start = [left - train - started_at - extra for left, train in (trials[0] for trials in by_actor.values())]
    return {"start_s": statistics.median(start), "steady_ms": steady_ms, "actors": len(by_actor)}


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
          "| phase start per actor s | steady fixed cost / later trial ms | load avg (1 min) before/after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs):
        split = f" ({r['in_trainable_ms']:.0f} + {r['outside_ms']:.0f})" if "in_trainable_ms" in r else ""
        print(f"| {i} | {r['trials']} | {r['wall_s']:.1f} | {r['trial_sum_s']:.1f} | {r['ratio']:.2f} | "
              f"{r['fixed_ms']:.0f}{split} | {r.get('start_s', float('nan')):.2f} | "
              f"{r.get('steady_ms', float('nan')):.0f} | {r['load_before']:.2f} / {r['load_after']:.2f} |")
    median = {k: statistics.median(r.get(k, float("nan")) for r in runs)
              for k in ("ratio", "fixed_ms", "start_s", "steady_ms")}
    print(f"median ratio: {median['ratio']:.2f}; median fixed cost per trial: {median['fixed_ms']:.0f} ms = a phase "
          f"start of {median['start_s']:.2f} s per trial actor, shared by its trials, and {median['steady_ms']:.0f} "
          "ms per later trial (targets: ratio <= 1.5 at 0.5-s trials, <= 1.05 at 6-s trials)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
