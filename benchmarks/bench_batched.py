"""Trials per minute: K trials trained one by one, one per process, and as one batched model (`train`, K members).

K trial configs of a catalog spec (`--spec`, default cpu_demo: μP PT, 2 channels, rank 8, 3 iterations, γ 2, base
width 32; the built-in Shakespeare corpus at 60k words, |V| 2000, seq 64; batch 16, eval every 25 steps on 2
batches) share width, steps and seed and differ, as a verify phase's samples do, u spread over (−0.5, 0.5): PT in
lr (1e-2 · 2^u) and w_H (1 − 0.6·u); any other family in lr (its default · 2^u) and every other hparam of its
space (its default · 2^(u/2)). For each width, every repeat runs these modes in this order (paired in time):

- alone-in-process: `train_trial` on `--solo-trials` configs in turn, in this process (data prepared once);
- one-per-process: `--process-trials` configs, each in a fresh `python -c` (interpreter start, torch import, data
  read from the on-disk cache, device set-up, training), one after another;
- concurrent (`--concurrent P`, off by default): P fresh processes at once sharing the device, each training
  `--process-trials` configs in turn — what P trial workers with a 1/P device fraction each do;
- batched: `train` on K configs, for each K in `--members`.

`--check` also trains the first two members of each K's batch alone, once, and reports the largest relative
difference of their final eval losses from the batched members' (float32: rounding, not a different trial).

A solo mode's seconds per trial do not depend on K (the trials are alike), so each is measured once per width and
repeat and every K row of that width is compared with it. The tables give medians over `--repeats`: seconds per
trial, trials per hour, batched's speed-up over each solo mode, and for the batched rows the model FLOP/s (matmul
FLOPs of the training steps from `studies.cost.sequence_flops`, evaluation not counted), the MFU against
`--peak-tflops` when given, and on CUDA the peak memory allocated. A K that runs out of device memory is recorded
as such and the larger K of that width are skipped.

    python benchmarks/bench_batched.py                       # CPU: widths 32, 64, 128; K 1, 4, 16, 61; 50 steps
    python benchmarks/bench_batched.py --widths 64 --members 16 --repeats 5 --out /tmp/bench_batched.json
    python benchmarks/bench_batched.py --device cuda --widths 128 256 512 1024 --concurrent 4 --peak-tflops 989
    python benchmarks/bench_batched.py --quick               # width 32, K 1 and 4, 5 steps, 1 repeat: a smoke run
    python benchmarks/bench_batched.py --spec hf_llama_cpu --widths 64 --members 1 8 --check  # a Hugging Face Llama
"""

from __future__ import annotations

import argparse
import functools
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
print(json.dumps({"train_s": sum(train_trial(cfg).wall_time_s for cfg in json.loads(sys.stdin.read()))}))
"""
DATA = {"max_tokens": 60_000, "seq_len": 64, "vocab_size": 2000}
BATCH = 16


SPEC = "cpu_demo"  # `--spec`


@functools.cache
def demo_spec():
    """The catalog spec `SPEC` with this benchmark's data (`DATA`; the family's objective)."""
    from studies import load_catalog
    from studies.spec import DataSpec

    spec = load_catalog(SPEC)
    return spec.model_copy(update={"data": DataSpec(**DATA, objective=spec.data.objective)})


def varied(defaults: dict[str, float], u: float) -> dict[str, float]:
    """The hparams of the member at u (module docstring)."""
    if demo_spec().model.family == "pt":
        return {**defaults, "lr": 1e-2 * 2**u, "w_H": 1 - 0.6 * u}
    return {h: v * 2 ** (u if h == "lr" else u / 2) for h, v in defaults.items()}


def configs(width: int, k: int, steps: int, device: str) -> list[dict]:
    """K trial configs at `width` that differ in their hparams only (`varied`)."""
    spec = demo_spec()
    data = spec.data.model_dump(mode="json")
    out = []
    for i in range(k):
        cfg = spec.trial_config(width, varied(spec.space.defaults(), (i + 0.5) / k - 0.5), 0, steps)
        cfg.update(data=data, batch_size=BATCH, eval_every=25, eval_batches=2, device=device)
        out.append(cfg)
    return out


def trial_flops(width: int, steps: int) -> float:
    """Model FLOPs of one trial's training steps at `width` (matmuls, forward + backward)."""
    from studies.cost import sequence_flops

    return sequence_flops(demo_spec(), width) * BATCH * steps


def solo_difference(cfgs: list[dict], results: list) -> float:
    """The largest relative difference of the first two members' final eval losses, batched and alone."""
    from workers.train import train_trial

    return max(abs(r.eval_loss - a.eval_loss) / abs(a.eval_loss)
               for r, a in zip(results, (train_trial(cfg) for cfg in cfgs[:2]), strict=False))


def sync(device: str) -> None:
    """Wait for the GPU's queued work, so that a clock read after it times finished work."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def alone(cfgs: list[dict]) -> tuple[float, int]:
    """Seconds per trial of `train_trial` on each config in turn, and how many did not complete."""
    from workers.train import train_trial

    sync(cfgs[0]["device"])
    start = time.perf_counter()
    results = [train_trial(cfg) for cfg in cfgs]
    sync(cfgs[0]["device"])
    return (time.perf_counter() - start) / len(cfgs), sum(r.status != "completed" for r in results)


def processes(groups: list[list[dict]], threads: int) -> float:
    """Seconds per trial of one fresh process per group, all started at once, each training its group in turn."""
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(threads)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True)
             for _ in groups]
    outs = [p.communicate(json.dumps(group)) for p, group in zip(procs, groups, strict=True)]
    wall = time.perf_counter() - start
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode:
            raise RuntimeError(f"a trial process failed:\n{err[-3000:]}")
    return wall / sum(len(g) for g in groups)


def batched(cfgs: list[dict]) -> tuple[float, int, int | None, list]:
    """Seconds per trial of one `train` over the configs, how many members did not complete, on CUDA the peak
    memory allocated (bytes), and the members' results."""
    import torch

    from workers.train import train

    cuda = cfgs[0]["device"] == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync(cfgs[0]["device"])
    start = time.perf_counter()
    results = train(cfgs)
    sync(cfgs[0]["device"])
    seconds = (time.perf_counter() - start) / len(cfgs)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return seconds, sum(r.status != "completed" for r in results), peak, results


def width_rows(width: int, args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """The solo modes' row of one width and its batched rows, one per K (medians over the repeats)."""
    import torch

    solo_cfgs = configs(width, args.solo_trials, args.steps, args.device)
    n = args.process_trials
    runs: dict[str, list[float]] = {"alone": [], "process": [], "concurrent": []}
    batch_cfgs = {k: configs(width, k, args.steps, args.device) for k in args.members}
    per_k: dict[int, dict] = {k: {"s": [], "mem": [], "not_completed": 0, "oom": False} for k in args.members}
    not_completed = 0
    for _ in range(args.repeats):
        s, bad = alone(solo_cfgs)
        runs["alone"].append(s)
        not_completed += bad
        runs["process"].append(processes([[cfg] for cfg in solo_cfgs[:n]], args.threads))
        if args.concurrent:
            runs["concurrent"].append(processes([solo_cfgs[:n]] * args.concurrent, args.threads))
        for k in args.members:
            if per_k[k]["oom"]:
                continue
            try:
                s, bad, mem, results = batched(batch_cfgs[k])
            except torch.OutOfMemoryError:
                for kk in args.members[args.members.index(k):]:
                    per_k[kk]["oom"] = True
                continue
            if args.check and "solo_diff" not in per_k[k]:
                per_k[k]["solo_diff"] = solo_difference(batch_cfgs[k], results)
            per_k[k]["s"].append(s)
            per_k[k]["mem"].append(mem)
            per_k[k]["not_completed"] += bad
    solo = {mode: statistics.median(v) for mode, v in runs.items() if v}
    flops = trial_flops(width, args.steps)
    solo_row = {"width": width, "s_per_trial": solo, "not_completed": not_completed, "runs": runs,
                "trial_tflop": flops / 1e12}
    rows = []
    for k, r in per_k.items():
        if r["oom"] and not r["s"]:
            rows.append({"width": width, "k": k, "oom": True})
            continue
        s = statistics.median(r["s"])
        tflops = flops / s / 1e12
        rows.append({"width": width, "k": k, "s_per_trial": s, "runs": r["s"], "not_completed": r["not_completed"],
                     "vs": {mode: v / s for mode, v in solo.items()}, "tflops": tflops,
                     "mfu": tflops / args.peak_tflops if args.peak_tflops else None,
                     "peak_mem_gib": max(r["mem"]) / 2**30 if r["mem"][0] is not None else None,
                     "solo_diff": r.get("solo_diff")})
    return solo_row, rows


def report(solos: list[dict], rows: list[dict], args: argparse.Namespace, load: float) -> None:
    print(f"\n{args.spec} on {args.device}, {args.steps} steps per trial, {args.threads} torch threads per process, "
          f"median of {args.repeats} repeats; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after. Alone: "
          f"{args.solo_trials} trials per repeat; one per process: {args.process_trials}"
          + (f"; concurrent: {args.concurrent} processes × {args.process_trials} trials" if args.concurrent else "")
          + ".\n")
    modes = ["alone", "process"] + (["concurrent"] if args.concurrent else [])
    names = {"alone": "alone in process", "process": "one per process", "concurrent": f"{args.concurrent} concurrent"}
    print("| width | " + " | ".join(f"{names[m]} s/trial (trials/h)" for m in modes) + " |")
    print("|---|" + "---|" * len(modes))
    for s in solos:
        print(f"| {s['width']} | " + " | ".join(f"{s['s_per_trial'][m]:.3f} ({3600 / s['s_per_trial'][m]:,.0f})"
                                               for m in modes) + " |")
    print("\n| width | K | batched s/trial | trials/h | " + " | ".join(f"vs {names[m]}" for m in modes)
          + " | TFLOP/s | MFU | peak mem GiB |")
    print("|---|---|---|---|" + "---|" * (len(modes) + 3))
    for r in rows:
        if r.get("oom"):
            print(f"| {r['width']} | {r['k']} | out of memory |" + " |" * (len(modes) + 4))
            continue
        mfu = f"{100 * r['mfu']:.2f} %" if r["mfu"] is not None else "—"
        mem = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "—"
        print(f"| {r['width']} | {r['k']} | {r['s_per_trial']:.3f} | {3600 / r['s_per_trial']:,.0f} | "
              + " | ".join(f"{r['vs'][m]:.2f}×" for m in modes) + f" | {r['tflops']:.2f} | {mfu} | {mem} |")
    diffs = [f"K {r['k']} {r['solo_diff']:.1e}" for r in rows if r.get("solo_diff") is not None]
    if diffs:
        print("\nbatched vs alone, largest relative difference of the final eval loss: " + ", ".join(diffs))
    if any(r.get("not_completed") for r in solos + rows):
        print("\nsome trials did not complete (diverged): see not_completed in the JSON")


def main() -> None:
    global SPEC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16, 61], help="K: trials per batch")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--solo-trials", type=int, default=4, help="alone-in-process trials per repeat")
    parser.add_argument("--process-trials", type=int, default=4, help="trials per repeat of one-per-process, and "
                        "trials per process of --concurrent")
    parser.add_argument("--concurrent", type=int, default=0, help="P: processes sharing the device at once (0: off)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, here and in every child process")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    parser.add_argument("--quick", action="store_true", help="width 32, K 1 and 4, 5 steps, 1 repeat")
    parser.add_argument("--out", "--json", dest="out", default=None, help="write the rows as JSON here")
    parser.add_argument("--spec", default=SPEC, help="the catalog spec whose model, arch and space are trained")
    parser.add_argument("--check", action="store_true", help="batched members against the same trials alone")
    args = parser.parse_args()
    SPEC = args.spec
    if args.quick:
        args.widths, args.members, args.steps, args.repeats = [32], [1, 4], 5, 1
        args.solo_trials = args.process_trials = 2
    args.process_trials = min(args.process_trials, args.solo_trials)
    os.environ["PTCTL_DATA_DIR"] = str(link_corpora(Path(tempfile.mkdtemp(prefix="ptctl-bench-"))))
    import torch

    torch.set_num_threads(args.threads)
    warm = configs(args.widths[0], 2, 1, args.device)
    alone(warm[:1])  # builds the on-disk data cache and loads the data once for this process
    batched(warm)  # first-call costs (imports, allocator, device set-up) kept out of the first row
    load = os.getloadavg()[0]
    solos, rows = [], []
    for width in args.widths:
        solo, krows = width_rows(width, args)
        solos.append(solo)
        rows += krows
        print(f"width {width}: solo {solo['s_per_trial']}; batched "
              + ", ".join(f"K {r['k']} {r['s_per_trial']:.3f}" if not r.get("oom") else f"K {r['k']} OOM"
                          for r in krows), flush=True)
        if args.out:  # after each width, so a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps({"args": vars(args), "torch": torch.__version__,
                                                  "solo": solos, "rows": rows}, indent=2))
    report(solos, rows, args, load)


if __name__ == "__main__":
    main()
