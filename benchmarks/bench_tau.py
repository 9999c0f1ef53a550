"""Tokens/s and peak memory, TauGPT vs its dot-product twin, training and cached decoding, same shapes, one run.

Two models from `build_model("tauformer", ...)` that differ only in `attention`: "tau" (logits
−|λq − λk| / T_h) and its twin "dot" (softmax(q·k/√D)), at identical shapes and seeds, both measured
in one invocation:

- **train**: full optimizer steps on random token ids (B, seq_len + 1), inputs and shifted labels:
  forward, next-token cross-entropy over every position, backward, AdamW step (`make_optimizer`: the
  trainer's parameter groups; no clipping, no lr schedule). τ is calibrated once on the batch first.
  `--warmup` untimed steps, then `--steps` timed ones; tokens/s = B · seq_len · steps / their time.
- **decode**, at each `--decode-batch`: greedy decoding through the model's `KVCache`, (V, λk) for
  "tau" and (K, V) for "dot". A random `--prompt`-token prompt is prefilled (logits of its last
  position only), then `--new-tokens` single-token steps each feed the previous argmax, so the cache
  ends holding prompt + new-tokens positions. tokens/s = B · new-tokens / time of those steps (the
  prefill is timed apart, in the JSON). `cache.nbytes()` at the end is reported for both, with the
  ratio. An untimed decode (prefill + `--warmup` steps, its own cache) runs first.

Each (mode, attention, repeat) runs in a fresh subprocess; each repeat alternates the order of tau
and dot. The table gives the median over `--repeats` with [min–max], and tau/dot = ratio of medians.

**Peak memory** is the growth over the memory at the start of the measured section, which begins
after the model, the inputs, τ's calibration and the warm-up exist (training: AdamW's state exists,
gradients are freed). It counts what the measured section allocates:
  train   gradients, activations saved for backward, temporaries of forward, backward and AdamW;
  decode  the cache (allocated in the section, for prompt + new tokens: torch zero-fills it, so every
          page is resident) plus the prefill's and the steps' activations.
CUDA: `max_memory_allocated` (after `reset_peak_memory_stats`) minus `memory_allocated` at the start.
CPU: the kernel's exact peak resident set, no sampling. At the start, freed warm-up memory is handed
back to the OS (`malloc_trim(0)`), so memory the section reuses from the warm-up counts too; then the
peak (VmHWM) is reset to the current resident set (`/proc/self/clear_refs` ← 5). The number is VmHWM
at the end minus VmHWM at the start: it also counts glibc heap fragmentation and any file-backed pages
(library code) first touched in the section, which are few after the warm-up. (Sampling /proc/self/statm
from a thread every 1 ms would cost 10–25% of decode tokens/s through the GIL.)

    python3 benchmarks/bench_tau.py --repeats 3 --json /tmp/bench_tau_cpu.json
    python3 benchmarks/bench_tau.py --preset 30m --device cuda --repeats 5

Results go to docs/LOG.md (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ATTENTIONS = ("tau", "dot")
# the post's 30M model: 6 layers × 6 heads of head_dim 64, width 384, 1024-token context, BERT vocabulary
PRESETS = {"30m": {"n_layers": 6, "width": 384, "head_dim": 64, "seq_len": 1024, "vocab": 30522,
                   "prompt": 128, "new_tokens": 896}}


# --------------------------------------------------------------------------------------------
# worker: one (mode, attention) in its own process
# --------------------------------------------------------------------------------------------
def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key + ":"))  # kB


@contextlib.contextmanager
def peak_growth(dev):
    """Yields a dict whose "bytes" is, on exit, the peak memory growth over the start (module docstring)."""
    import torch

    out: dict[str, int] = {}
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield out
        torch.cuda.synchronize()
        out["bytes"] = torch.cuda.max_memory_allocated() - base
        return
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed warm-up memory back, so reusing it counts
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident set (VmHWM) to the current one
    base = _status_bytes("VmHWM")
    yield out
    out["bytes"] = _status_bytes("VmHWM") - base


def worker(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from workers.models import build_model
    from workers.train import TrialConfig, make_optimizer

    torch.set_num_threads(spec["threads"])
    dev = torch.device(spec["device"])
    torch.manual_seed(0)
    model = build_model("tauformer", vocab_size=spec["vocab"], width=spec["width"], head_dim=spec["head_dim"],
                        n_layers=spec["n_layers"], max_len=spec["max_len"], attention=spec["attention"]).to(dev)
    g = torch.Generator().manual_seed(1)
    B, V, warmup = spec["batch"], spec["vocab"], spec["warmup"]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    result = {k: spec[k] for k in ("mode", "attention", "batch", "repeat")}
    result.update(params=sum(p.numel() for p in model.parameters()), threads=torch.get_num_threads())
    if spec["mode"] == "train":
        T = spec["seq_len"]
        ids = torch.randint(0, V, (B, T + 1), generator=g).to(dev)
        inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].reshape(-1)
        result["tau_value"] = model.calibrate(inputs, 0)
        opt = make_optimizer(model, TrialConfig(model="tauformer"))

        def step() -> float:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(inputs).flatten(0, 1), labels)
            loss.backward()
            opt.step()
            return float(loss.detach())

        for _ in range(warmup):
            step()
        opt.zero_grad(set_to_none=True)
        times, losses = [], []
        with peak_growth(dev) as mem:
            for _ in range(spec["steps"]):
                t0 = time.perf_counter()
                losses.append(step())  # float(loss) synchronises
                times.append(time.perf_counter() - t0)
        result.update(step_s=times, loss=losses, tokens_per_s=B * T * len(times) / sum(times))
    else:
        P, N = spec["prompt"], spec["new_tokens"]
        prompt = torch.randint(0, V, (B, P), generator=g).to(dev)
        last = torch.zeros(B, P, dtype=torch.bool, device=dev)
        last[:, -1] = True
        result["tau_value"] = model.calibrate(prompt, 0)

        @torch.no_grad()
        def decode(steps: int) -> tuple:
            cache = model.new_cache(B, P + steps)
            sync()
            t0 = time.perf_counter()
            nxt = model(prompt, cache=cache, select=last).argmax(-1, keepdim=True)  # (B, 1)
            sync()
            t1 = time.perf_counter()
            for _ in range(steps):
                nxt = model(nxt, cache=cache)[:, -1].argmax(-1, keepdim=True)
            sync()
            return cache, t1 - t0, time.perf_counter() - t1

        decode(warmup)
        with peak_growth(dev) as mem:
            cache, prefill_s, decode_s = decode(N)
        result.update(prefill_s=prefill_s, decode_s=decode_s, tokens_per_s=B * N / decode_s,
                      cache_bytes=cache.nbytes())
    result["peak_mem_bytes"] = mem["bytes"]
    return result


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------
def run_one(spec: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"worker {spec['mode']}/B={spec['batch']}/{spec['attention']} failed:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def summarize(runs: list[dict]) -> list[dict]:
    """Per (mode, batch): medians and [min, max] over the repeats for each attention, and tau/dot ratios."""
    rows = []
    for mode, batch in dict.fromkeys((r["mode"], r["batch"]) for r in runs):
        row: dict = {"mode": mode, "batch": batch}
        for key in ("tokens_per_s", "peak_mem_bytes") + (("cache_bytes",) if mode == "decode" else ()):
            for att in ATTENTIONS:
                vals = [r[key] for r in runs if (r["mode"], r["batch"], r["attention"]) == (mode, batch, att)]
                row[f"{key}.{att}"] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
            row[f"{key}.ratio"] = row[f"{key}.tau"]["median"] / row[f"{key}.dot"]["median"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    def spread(s: dict, scale: float = 1.0, fmt: str = ",.0f") -> str:
        return f"{s['median'] / scale:{fmt}} [{s['min'] / scale:{fmt}}–{s['max'] / scale:{fmt}}]"

    out = ["| mode | B | tau tokens/s | dot tokens/s | tau/dot | tau peak MiB | dot peak MiB | tau/dot "
           "| tau cache MiB | dot cache MiB | tau/dot |", "|---" * 11 + "|"]
    for r in rows:
        cells = [r["mode"], str(r["batch"])]
        for key, scale, fmt in (("tokens_per_s", 1, ",.0f"), ("peak_mem_bytes", 2**20, ",.1f"),
                                ("cache_bytes", 2**20, ",.2f")):
            if f"{key}.ratio" not in r:
                cells += ["—"] * 3
                continue
            cells += [spread(r[f"{key}.{a}"], scale, fmt) if key != "cache_bytes" else
                      f"{r[f'{key}.{a}']['median'] / scale:{fmt}}" for a in ATTENTIONS]
            cells.append(f"**{r[f'{key}.ratio']:.3f}**")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="shape preset (explicit flags override it); 30m is meant for a GPU")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op CPU threads")
    ap.add_argument("--width", type=int, default=256, help="n_heads · head_dim")
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=256, help="training sequence length")
    ap.add_argument("--batch", type=int, default=8, help="training batch")
    ap.add_argument("--steps", type=int, default=5, help="timed training steps per repeat")
    ap.add_argument("--warmup", type=int, default=2, help="untimed training steps / decode steps before timing")
    ap.add_argument("--decode-batch", default="1,8", help="comma-separated decoding batch sizes")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens prefilled before decoding")
    ap.add_argument("--new-tokens", type=int, default=192, help="timed single-token decode steps")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per (mode, attention)")
    ap.add_argument("--json", type=Path, default=None, help="write the raw numbers and the environment here")
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args(argv)
    if args.preset:
        ap.set_defaults(**PRESETS[args.preset])
    args = ap.parse_args(argv)

    if args._worker:
        print("RESULT " + json.dumps(worker(json.loads(args._worker))), flush=True)
        return

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    shape = {"width": args.width, "head_dim": args.head_dim, "n_layers": args.n_layers, "vocab": args.vocab,
             "max_len": max(args.seq_len, args.prompt + max(args.new_tokens, args.warmup))}
    modes = [("train", args.batch)] + [("decode", int(b)) for b in args.decode_batch.split(",")]
    loadavg_before, start = os.getloadavg(), time.time()
    runs = []
    for repeat in range(args.repeats):
        for mode, batch in modes:
            for attention in ATTENTIONS if repeat % 2 == 0 else ATTENTIONS[::-1]:
                spec = {**shape, "mode": mode, "batch": batch, "attention": attention, "repeat": repeat,
                        "device": device, "threads": args.threads, "seq_len": args.seq_len, "steps": args.steps,
                        "warmup": args.warmup, "prompt": args.prompt, "new_tokens": args.new_tokens}
                t0 = time.time()
                runs.append(run_one(spec))
                print(f"[repeat {repeat} {mode} B={batch} {attention}] {runs[-1]['tokens_per_s']:,.0f} tokens/s, "
                      f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    env = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "device_name": _device_name(device),
        "cpu_count": os.cpu_count(),
        "threads": runs[0]["threads"],
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.time() - start,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "_worker"},
    }
    rows = summarize(runs)
    md = table(rows)
    params = {r["attention"]: r["params"] for r in runs}
    print(
        f"\n{env['device_name']} ({device}), torch {torch.__version__}, {env['threads']} threads, "
        f"load {loadavg_before[0]:.2f} → {env['loadavg_after'][0]:.2f}, {env['wall_s']:.0f} s\n"
        f"TauGPT width {args.width} ({args.width // args.head_dim} heads × {args.head_dim}), {args.n_layers} layers, "
        f"|V| {args.vocab}; params tau {params['tau']:,} / dot {params['dot']:,}\n"
        f"train: seq {args.seq_len}, {args.warmup} warm-up + {args.steps} timed AdamW steps; decode: prompt "
        f"{args.prompt}, {args.new_tokens} cached greedy steps; fp32; median [min–max] of {args.repeats} repeats\n"
    )
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"env": env, "runs": runs, "summary": rows, "table": md}, indent=2))


if __name__ == "__main__":
    main()
