"""Muon against AdamW after both were transferred: does Muon's lr optimum transfer, and what does Muon buy?

For each family (`--families`, default PT and BERT, cpu_demo-sized), on the built-in Shakespeare corpus:

1. **Muon's lr sweep** (`train.optimizer: muon`) at `--widths` under mup and standard, `--seeds` seeds: the drift
   of the optimal lr per doubling of width with its 95 % interval over seeds (`analysis.lr_drift`, validate's
   own), and the regret at the widest width of carrying the proxy's optimum there (`analysis.transfer_regret`).
2. **Each optimiser's own proxy tuning**: AdamW's lr swept at the proxy width (the smallest) under mup beside
   Muon's; each optimum interpolated in log lr (`analysis.lr_optima`), as a tuned centre would be.
3. **The comparison at the target** (the widest width, mup): each optimiser at its own transferred lr, the same
   model, data order and tokens, `--target-seeds` seeds. Reported: the final eval loss of each (mean, 95 %
   t-interval over seeds), Muon − AdamW paired by seed (the same init and batches), and the tokens Muon needs to
   reach AdamW's mean final loss (linear interpolation on its eval curve, per seed), as a speed-up = AdamW's
   tokens / Muon's, with its interval.

Trials of one (family, optimiser, parametrization, width, seed) that differ only in lr train as one batched model
(`workers.batched`); `--jobs` processes share the work. The trials are ptctl's own (`workers.train.train`), the
analysis the validate phase's, so a study with `train.optimizer: muon` reports the same drift for the same runs.

    python benchmarks/bench_muon.py                                   # PT and BERT, widths 32 64 128, 2 seeds
    python benchmarks/bench_muon.py --families pt --widths 32 128 --steps 100 --out /tmp/muon   # smaller
    python benchmarks/bench_muon.py --families pt --widths 128 256 512 1024 --device cuda --jobs 1  # a GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _data import ROOT, link_corpora  # benchmarks/_data.py: the shared corpus cache

sys.path.insert(0, str(ROOT))  # ptctl's packages (workers, analysis) from this checkout

ARCH = {"pt": {"n_channels": 2, "rank": 8, "n_iter": 3, "gamma": 2},  # cpu_demo's; channels: r fixed as d grows
        "bert": {"n_layers": 2, "head_dim": 16, "max_len": 64}}
DATA = {"source": "shakespeare", "tokenizer": "word", "vocab_size": 5000, "seq_len": 64, "max_tokens": 300_000,
        "eval_fraction": 0.05, "max_eval_sequences": 128}
LRS = [0.0025, 0.005, 0.01, 0.02, 0.04, 0.08]


def _train(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One batch: the job's lrs as members of one batched model; a row per member with its eval curve."""
    import torch

    torch.set_num_threads(1)
    from workers.train import TrialConfig, train

    hp = {**ARCH[job["family"]], "width": job["width"], "base_width": job["base"],
          "parametrization": job["parametrization"]}
    cfgs = [TrialConfig(model=job["family"], model_hp=hp, data=DATA, lr=lr, seed=job["seed"],
                        optimizer=job["optimizer"], steps=job["steps"], batch_size=16, warmup_steps=10,
                        eval_every=job["eval_every"], eval_batches=4, log_every=job["eval_every"], device=job["device"])
            for lr in job["lrs"]]
    start = time.perf_counter()
    reports = train(cfgs)
    wall = time.perf_counter() - start
    return [{k: v for k, v in job.items() if k != "lrs"} | {
        "lr": lr, "status": str(r.status), "eval_loss": r.eval_loss, "wall_s": wall / len(cfgs),
        "curve": [(row["tokens"], row["eval_loss"]) for row in r.rows if "eval_loss" in row]}
        for lr, r in zip(job["lrs"], reports, strict=True)]


def _interval(values: list[float]) -> tuple[float, float, float] | None:
    """Mean and 95 % t-interval (`analysis.regret.t_interval`; None: fewer than 2 values)."""
    from analysis.regret import t_interval

    ci = t_interval(values)
    return None if ci is None else (statistics.fmean(values), *ci)


def _said(stat: tuple[float, float, float] | None, fmt: str = "{:.4f}") -> str:
    return "—" if stat is None else f"{fmt.format(stat[0])} [{fmt.format(stat[1])}, {fmt.format(stat[2])}]"


def _optimum(rows: list[dict[str, Any]]) -> float:
    """The seed-mean sweep's interpolated optimal lr (`analysis.lr_optima`) of one (parametrization, width)."""
    import pandas as pd

    from analysis.transfer import lr_curves, lr_optima

    table = pd.DataFrame(rows).assign(phase="validate")
    return float(2.0 ** lr_optima(lr_curves(table))[0].log2_lr_interp)


def family_report(family: str, rows: list[dict[str, Any]], widths: list[int]) -> dict[str, Any]:
    import pandas as pd

    from analysis.optimizers import tokens_to
    from analysis.regret import regret_line, transfer_regret
    from analysis.transfer import lr_drift

    proxy, target = widths[0], widths[-1]
    sweep = [r for r in rows if r["stage"] == "sweep"]
    muon = pd.DataFrame([r for r in sweep if r["optimizer"] == "muon"]).assign(phase="validate")
    drift = lr_drift(muon)
    lr = family_report_lrs(family, rows, widths)
    regret = regret_line(transfer_regret(muon, {"lr": lr["muon"]}, [target], proxy_width=proxy))
    runs = {opt: sorted((r for r in rows if r["stage"] == "target" and r["optimizer"] == opt),
                        key=lambda r: r["seed"]) for opt in ("adamw", "muon")}
    final = {opt: [r["eval_loss"] for r in runs[opt]] for opt in runs}
    paired = [m - a for m, a in zip(final["muon"], final["adamw"], strict=True)]
    goal = statistics.fmean(final["adamw"])
    total = runs["adamw"][0]["curve"][-1][0]
    reached = [tokens_to(r["curve"], goal) for r in runs["muon"]]
    speedups = [total / t for t in reached if t is not None]
    return {
        "family": family, "proxy": proxy, "target": target, "lr": lr,
        "drift": {p: {"drift": drift.drift[p], "ci": drift.drift_ci.get(p)} for p in drift.drift},
        "verdict": drift.verdict, "regret": regret,
        "final": {opt: _interval(v) for opt, v in final.items()}, "muon_minus_adamw": _interval(paired),
        "adamw_tokens": total, "muon_tokens_to_adamw_final": reached, "speedup": _interval(speedups),
        "speedup_each": speedups,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="pt,bert")
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--lrs", type=float, nargs="+", default=LRS)
    parser.add_argument("--seeds", type=int, default=2, help="seeds of the sweeps")
    parser.add_argument("--target-seeds", type=int, default=3, help="seeds of each optimiser at the target")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--jobs", type=int, default=2, help="processes training batches at once")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the trials train")
    parser.add_argument("--out", type=Path, default=None, help="write rows.json and summary.json there")
    args = parser.parse_args()
    os.environ["PTCTL_DATA_DIR"] = str(link_corpora(Path(tempfile.mkdtemp(prefix="ptctl-bench-"))))
    families, widths = args.families.split(","), sorted(args.widths)
    common = {"base": widths[0], "steps": args.steps, "eval_every": args.eval_every, "device": args.device}
    jobs = [{"family": f, "optimizer": "muon", "parametrization": p, "width": w, "seed": s, "stage": "sweep",
             "lrs": args.lrs, **common}
            for f, p, w, s in itertools.product(families, ("mup", "standard"), widths, range(args.seeds))]
    jobs += [{"family": f, "optimizer": "adamw", "parametrization": "mup", "width": widths[0], "seed": s,
              "stage": "sweep", "lrs": args.lrs, **common} for f, s in itertools.product(families, range(args.seeds))]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [r for batch in pool.map(_train, jobs) for r in batch]
        targets = []
        for f in families:
            report = family_report_lrs(f, rows, widths)
            targets += [{"family": f, "optimizer": opt, "parametrization": "mup", "width": widths[-1], "seed": s,
                         "stage": "target", "lrs": [report[opt]], **common}
                        for opt, s in itertools.product(("adamw", "muon"), range(args.target_seeds))]
        rows += [r for batch in pool.map(_train, targets) for r in batch]
    wall = time.perf_counter() - start
    summary = [family_report(f, [r for r in rows if r["family"] == f], widths) for f in families]
    print(f"bench_muon: {len(rows)} trials in {wall / 60:.1f} min ({os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f} at the end)\n")
    print("| family | Muon lr* drift per doubling, mup [95 % CI] | standard | Muon lr* / AdamW lr* at the proxy | "
          "final loss at the target, AdamW | Muon | Muon − AdamW (paired) | speed-up to AdamW's final loss |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        def drift(p: str, s: dict[str, Any] = s) -> str:
            d = s["drift"].get(p)
            if d is None:
                return "—"
            ci = f" [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}]" if d["ci"] else ""
            return f"{d['drift']:+.2f}{ci}"
        reached = sum(t is not None for t in s["muon_tokens_to_adamw_final"])
        print(f"| {s['family']} (d {s['proxy']} → {s['target']}) | {drift('mup')} | {drift('standard')} | "
              f"{s['lr']['muon']:.3g} / {s['lr']['adamw']:.3g} | {_said(s['final']['adamw'])} | "
              f"{_said(s['final']['muon'])} | {_said(s['muon_minus_adamw'], '{:+.4f}')} | "
              f"{_said(s['speedup'], '{:.2f}')}× ({reached}/{len(s['muon_tokens_to_adamw_final'])} seeds reach it) |")
    for s in summary:
        print(f"\n{s['family']}: {s['verdict']}\n{s['regret']}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rows.json").write_text(json.dumps(rows))
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))


def family_report_lrs(family: str, rows: list[dict[str, Any]], widths: list[int]) -> dict[str, float]:
    """Each optimiser's interpolated optimum at the proxy width under mup: the lr it transfers."""
    mine = [r for r in rows if r["family"] == family and r["width"] == widths[0] and r["parametrization"] == "mup"]
    return {opt: _optimum([r for r in mine if r["optimizer"] == opt]) for opt in ("adamw", "muon")}


if __name__ == "__main__":
    main()
