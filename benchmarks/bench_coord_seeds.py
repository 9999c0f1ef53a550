"""Is the coordinate check's verdict the same on every seed set? PT's check (`coord_check`) run on several
disjoint seed sets under μP, and once under the standard parametrization.

Each μP run starts with `--seeds` seeds (base_seed, base_seed + 1, …) and adds batches while the verdict is
inconclusive, up to `--max-seeds`; the check is stable when every μP seed set passes and the standard one
fails. The suite checks one seed set of each (`tests/workers/test_coord_check.py`); this repeats it.

    python benchmarks/bench_coord_seeds.py                                 # seed sets 0, 100, 200; standard 300
    python benchmarks/bench_coord_seeds.py --bases 0,100,200,400,500 --paradigm rank

Prints a Markdown table: per run its seeds, status, fewest seeds behind a judged slope, widest judged
interval, worst offence (if any), wall and CPU seconds, and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", default="0,100,200", help="μP seed sets' first seeds, comma-separated")
    parser.add_argument("--standard-base", type=int, default=300, help="the standard run's first seed (-1: none)")
    parser.add_argument("--paradigm", default="channels", choices=("channels", "rank"))
    parser.add_argument("--widths", default="32,64,128,256")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--max-seeds", type=int, default=8)
    args = parser.parse_args(argv)

    from workers.coord_check import coord_check  # torch is imported here, after the argument check

    widths = tuple(int(w) for w in args.widths.split(","))
    runs = [("mup", int(b)) for b in args.bases.split(",")]
    if args.standard_base >= 0:
        runs.append(("standard", args.standard_base))
    print(f"widths {widths}, steps {args.steps}, paradigm {args.paradigm}, seeds {args.seeds} "
          f"(μP up to {args.max_seeds}), torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}\n")
    print("| parametrization | seeds | status | n_seeds | widest half-width | worst offence | wall s | CPU s | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for parametrization, base in runs:
        start, cpu = time.perf_counter(), _cpu()
        max_seeds = args.max_seeds if parametrization == "mup" else args.seeds
        df, _, verdict, _ = coord_check(parametrization=parametrization, widths=widths, steps=args.steps,
                                        seeds=args.seeds, max_seeds=max_seeds, base_seed=base,
                                        model_hp={"paradigm": args.paradigm})
        wall, cpu = time.perf_counter() - start, _cpu() - cpu
        seeds = sorted(df["seed"].unique())
        worst = max(verdict.offending, key=lambda o: abs(o.slope or 0.0), default=None)
        offence = f"{worst.name}@{worst.step} {worst.slope or float('nan'):+.2f}" if worst else "—"
        half = "—" if verdict.max_half_width is None else f"{verdict.max_half_width:.2f}"
        print(f"| {parametrization} | {seeds[0]}–{seeds[-1]} | {verdict.status} | {verdict.n_seeds} | {half} | "
              f"{offence} | {wall:.1f} | {cpu:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
