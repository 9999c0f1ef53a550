"""How often the lr forecast's intervals hold the optimum: every swept point of the stored studies left out in turn.

Each study is a catalog spec and the trials.csv it produced (`STUDIES`). For each, `analysis.forecast.
leave_out_score` predicts every swept point of the μP lr sweeps from a fit without its width (and, with three or
more horizons, its horizon), as the study's own validate phase would (steps, batch sizes, seq_len and Step Law's
parameter counts from the spec). Printed, per study and pooled: the points, the median and 90th-percentile |error|
in log2 lr and in nats (the loss at the predicted lr above the curve's minimum), the nominal 95 % t-interval's
coverage of the observed optima, Step Law's errors on the same points, and the split-conformal multiplier of
|error| / se:

- per study, from its own points when they are enough (19 at 95 %), its coverage by leave-one-out; with fewer, the
  largest of them ("max", a guaranteed level of n / (n + 1)), each point against the others' largest;
- pooled over every study: the multiplier `analysis.forecast.POOLED_MULTIPLIERS` ships, and its coverage measured
  on studies left out of its calibration: each study's points against the multiplier of the others' points (where
  the others hold too few for the level's quantile, their largest score, whose guaranteed level is n / (n + 1) for
  n points: the column says "max of n").

    python benchmarks/forecast_coverage.py
    python benchmarks/forecast_coverage.py --level 0.9
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.forecast import (
    ErrorSummary,
    LeaveOut,
    conformal_quantile,
    leave_out_score,
    loo_coverage,
    min_scores,
    summarise,
)
from studies.phases.validate_forecast import non_embedding_params
from studies.spec import StudySpec
from studies.sweeps import SWEEPS, with_sweep
from studies.sweeps.batch import batch_steps

ROOT = Path(__file__).resolve().parent.parent
STUDIES = {  # name: (catalog spec, its trial table)
    "cpu_demo": ("studies/catalog/cpu_demo.yaml", "docs/demo/cpu_demo_trials.csv"),
    "hf_llama_cpu": ("studies/catalog/hf_llama_cpu.yaml", "docs/hf/hf_llama_cpu_trials.csv"),
    "tau_cpu": ("studies/catalog/tau_cpu.yaml", "docs/tau/tau_cpu_trials.csv"),
    "tau_cpu_dot": ("studies/catalog/tau_cpu_dot.yaml", "docs/tau/tau_cpu_dot_trials.csv"),
    "pt_lr_alignment": ("studies/catalog/pt_lr_alignment.yaml", "docs/lr_alignment/lr_alignment_trials.csv"),
    "forecast_cpu": ("studies/catalog/forecast_cpu.yaml", "docs/forecast/forecast_cpu_trials.csv"),
    "nanogpt_axes": ("studies/catalog/nanogpt_axes.yaml", "docs/forecast/nanogpt_axes_trials.csv"),
}


def score(spec_path: str, table_path: str, level: float) -> LeaveOut:
    """The study's leave-out scoring, its inputs as the validate phase gives them (`forecast_at`), no pooling."""
    spec = StudySpec.from_yaml(ROOT / spec_path)
    v = spec.validate_
    if v is None:
        raise ValueError(f"{spec_path} has no validate phase: it sweeps nothing")
    table = pd.read_csv(ROOT / table_path)
    table = with_sweep(spec, table)
    table = table[table["sweep"].isin([s.name for s in SWEEPS.values() if s.forecast]) | (table["phase"] != "validate")]
    return leave_out_score(table, steps=spec.validate_horizon(), batch_size=spec.batch_for("validate"),
                           batch_steps={b: batch_steps(spec, b) for b in v.batch_sizes or []},
                           n_params=non_embedding_params(spec, list(v.widths)), seq_len=spec.data.seq_len,
                           level=level, pooled={})


def _scores(out: LeaveOut) -> list[float]:
    return [abs(h.error_log2) / h.se for h in out.points if h.se]


def _cells(s: ErrorSummary | None) -> list[str]:
    if s is None or s.median_log2 is None or s.p90_log2 is None:
        return ["—"] * 4
    nats = [f"{x:.3g}" if x is not None else "—" for x in (s.median_nats, s.p90_nats)]
    return [f"{s.median_log2:.2f}", f"{s.p90_log2:.2f}", *nats]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", type=float, default=0.95, help="the intervals' nominal coverage")
    args = parser.parse_args()
    level = args.level
    results = {name: score(spec, table, level) for name, (spec, table) in STUDIES.items()
               if (ROOT / table).is_file()}
    missing = sorted(set(STUDIES) - set(results))
    pooled_scores = {name: _scores(out) for name, out in results.items()}
    everything = [s for scores in pooled_scores.values() for s in scores]
    pooled_q = conformal_quantile(everything, level)

    head = ["study", "points", "|err| med log2", "p90 log2", "med nats", "p90 nats", "t covered",
            "own conformal (LOO)", "pooled of the others: ×, covered", "Step Law med log2", "p90 log2", "med nats",
            "p90 nats"]
    print(f"Leave-out scoring of the lr forecast, nominal {level:.0%} (need {min_scores(level)} points for a "
          "conformal quantile)\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    held_out_covered = held_out_scored = 0
    for name, out in results.items():
        scores = pooled_scores[name]
        own_q = conformal_quantile(scores, level)
        own_cov = loo_coverage(scores, level)
        own = (f"×{own_q:.2f}, {own_cov}/{len(scores)}" if own_q is not None and own_cov is not None
               else f"×{own_q:.2f}, unmeasurable" if own_q is not None
               else f"max ×{out.multiplier:.2f} ({out.level:.0%}), {out.covered}/{len(scores)}"
               if out.source == "max" and out.multiplier is not None and out.level is not None
               else f"too few ({len(scores)})")
        others = [s for other, ss in pooled_scores.items() if other != name for s in ss]
        q = conformal_quantile(others, level)
        short = q is None and bool(others)  # too few for the level: their largest, a level of n / (n + 1)
        q = max(others) if short else q
        if not scores or q is None:
            loso = "—" if not scores else "no other study's points"
        else:
            k = sum(s <= q for s in scores)
            held_out_covered, held_out_scored = held_out_covered + k, held_out_scored + len(scores)
            loso = f"×{q:.2f}{f' (max of {len(others)})' if short else ''}, {k}/{len(scores)}"
        print(f"| {name} | {len(out.points)} | " + " | ".join(_cells(out.errors)) +
              f" | {out.t_covered}/{out.t_scored} | {own} | {loso} | " + " | ".join(_cells(out.steplaw)) + " |")
    points = [h for out in results.values() for h in out.points]
    errors, law_summary = summarise(points)
    t_cov, t_n = sum(o.t_covered for o in results.values()), sum(o.t_scored for o in results.values())
    loo = loo_coverage(everything, level)
    pooled = (f"×{pooled_q:.2f}, LOO {loo}/{len(everything)}" if pooled_q is not None and loo is not None
              else f"too few ({len(everything)})")
    print(f"| **pooled** | {len(points)} | " + " | ".join(_cells(errors)) + f" | {t_cov}/{t_n} | "
          f"{pooled} | held-out studies: {held_out_covered}/{held_out_scored} | " + " | ".join(_cells(law_summary))
          + " |")
    skipped = {name: out.skipped for name, out in results.items() if out.skipped}
    for name, why in skipped.items():
        print(f"\n{name}: {len(why)} points not predictable, e.g. {why[0]}")
    if missing:
        print(f"\nno trial table for {', '.join(missing)}: run the study and save its trials.csv there")
    if pooled_q is not None:
        print(f"\nPOOLED_MULTIPLIERS = {{{level}: {pooled_q:.3f}}}  # {len(everything)} points from "
              f"{sum(bool(s) for s in pooled_scores.values())} studies")


if __name__ == "__main__":
    main()
