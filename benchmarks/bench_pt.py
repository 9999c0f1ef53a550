"""Train-step throughput, model FLOPs and peak memory of PT against a Universal-Transformer encoder.

For each PT config (a small one and the PT paper's PTB config, spec §2.8) this measures one
AdamW training step (forward + MLM loss + backward + step) of

- PT, standard parametrization (`build_model("pt", ...)`), and
- a plain PyTorch Universal-Transformer-style encoder: one shared pre-LN layer
  (`scaled_dot_product_attention` with PT's width d and h heads, FFN 4d) applied T times, with
  the same vocabulary, learned positions and the same untied d → |V| MLM head,

and reports tokens/s, model FLOPs per token counted from the shapes (`pt_flops` / `ut_flops`,
×3 for forward + backward), achieved FLOP/s, peak memory, and the ratio
PT achieved FLOP/s ÷ encoder achieved FLOP/s (how well PT's arithmetic uses the hardware
compared with dense attention + FFN at the same width).

Every (config, model) pair runs in a fresh subprocess, so peak memory is that process's own:
on CPU the peak resident set (`ru_maxrss`) minus the resident set just before the first step,
on CUDA `torch.cuda.max_memory_allocated` minus the memory allocated before the first step.
Both therefore include gradients and AdamW state as well as activations. Timings: 2 warm-up
steps, then `--repeats` blocks of `--steps` timed steps; the step time is the median of the
block medians, with the min and max block median beside it.

    python3 benchmarks/bench_pt.py --device cpu --steps 5 --repeats 3 --json results.json
    python3 benchmarks/bench_pt.py --device cuda --steps 20 --repeats 5
    python3 benchmarks/bench_pt.py --threads 2 --profile 3 --configs ptb --models pt   # op breakdown
    python3 benchmarks/bench_pt.py --models pt,pt-store,ut   # before/after of PTConfig.recompute in one run

Models: `pt` (PTConfig defaults: recompute=True), `pt-store` (recompute=False: the indexed kernels
differentiated by autograd, the implementation before issue 14), `ut` (the encoder). `--autocast
bf16` runs every model's forward under torch.autocast; `--compile` wraps each in torch.compile.

Results go to docs/LOG.md (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIGS = {
    "small": {"d": 128, "h": 8, "r": 16, "T": 3, "gamma": 3},
    "cpu_demo": {"d": 64, "h": 4, "r": 8, "T": 3, "gamma": 2},  # the verify trials of studies/catalog/cpu_demo.yaml
    "ptb": {"d": 384, "h": 16, "r": 64, "T": 5, "gamma": 3},  # PT paper Table 2 (MLM-PTB)
}


# --------------------------------------------------------------------------------------------
# FLOP formulas (multiply-add = 2 FLOPs; matmuls only, elementwise ops and softmaxes not counted)
# --------------------------------------------------------------------------------------------
def pt_flops(d: int, h: int, r: int, T: int, gamma: int, n: int, vocab: int, block_msg: bool = False) -> dict:
    """Model FLOPs per token of one PT training step (forward ×3), term by term.

    Per MFVI iteration and sequence, as `workers/models/pt.py` computes them:
      projections   q_k = P·U_k, k_k = P·V_k for all K buckets and h channels   2 · 2·n·d·K·h·r
      far scores    q k ᵀ for the two far buckets, full n×n then masked            n_far · 2·h·n²·r
      near scores   <q_k[i], k_k[j]> on the 2γ near diagonals (P_near pairs)     2·h·P_near·r
      gathers       A·k (dependent side), Aᵀ·q (head side): far n×n + near     n_msg · (far + near scores)
      back          ctx_dep·Uᵀ and ctx_head·Vᵀ over K·h·r                        n_msg · 2·n·K·h·r·d
    plus the MLM head 2·n·d·|V| once; n_msg = 1 with block_msg. Backward ≈ 2× forward.
    """
    K = 2 * gamma + 2
    n_far = 2
    p_near = sum(2 * (n - off) for off in range(1, min(gamma, n - 1) + 1))
    n_msg = 1 if block_msg else 2
    per_iter = {
        "projections": 2 * (2 * n * d * K * h * r),
        "far_scores": n_far * 2 * h * n * n * r,
        "near_scores": 2 * h * p_near * r,
        "gathers": n_msg * (n_far * 2 * h * n * n * r + 2 * h * p_near * r),
        "back_projections": n_msg * 2 * n * K * h * r * d,
    }
    terms = {k: T * v / n for k, v in per_iter.items()}  # per token, all iterations
    terms["mlm_head"] = 2 * d * vocab
    fwd = sum(terms.values())
    return {"terms_fwd_per_token": terms, "fwd_per_token": fwd, "train_per_token": 3 * fwd}


def ut_flops(d: int, h: int, T: int, n: int, vocab: int, ffn_mult: int = 4) -> dict:
    """Model FLOPs per token of one Universal-Transformer encoder training step (forward ×3).

    Per layer application: QKV 2·3d², scores QKᵀ 2·n·d, attention·V 2·n·d, output 2·d²,
    FFN 2·2·d·(ffn_mult·d); applied T times; plus the MLM head 2·d·|V|.
    """
    terms = {
        "qkv_out_projections": T * 2 * 4 * d * d,
        "attention": T * 2 * 2 * n * d,
        "ffn": T * 2 * 2 * d * ffn_mult * d,
        "mlm_head": 2 * d * vocab,
    }
    fwd = sum(terms.values())
    return {"terms_fwd_per_token": terms, "fwd_per_token": fwd, "train_per_token": 3 * fwd}


# --------------------------------------------------------------------------------------------
# the encoder baseline
# --------------------------------------------------------------------------------------------
def make_ut(vocab: int, d: int, h: int, T: int, n_max: int, ffn_mult: int = 4):
    import torch.nn.functional as F
    from torch import nn

    class UTEncoder(nn.Module):
        """One shared pre-LN Transformer layer applied T times (Universal Transformer without ACT)."""

        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(n_max, d)
            self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ff1, self.ff2 = nn.Linear(d, ffn_mult * d), nn.Linear(ffn_mult * d, d)
            self.decoder = nn.Linear(d, vocab)

        def forward(self, input_ids, attention_mask=None):
            B, n = input_ids.shape
            x = self.emb(input_ids) + self.pos.weight[:n]
            mask = None if attention_mask is None else attention_mask[:, None, None, :]
            for _ in range(T):
                q, k, v = self.qkv(self.ln1(x)).view(B, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                x = x + self.out(a.transpose(1, 2).reshape(B, n, d))
                x = x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
            return self.decoder(self.ln_f(x))

    return UTEncoder()


# --------------------------------------------------------------------------------------------
# worker: one (config, model) in its own process
# --------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def profile_steps(step, n_steps: int, device: str) -> str:
    """torch.profiler over `n_steps` train steps: the ops' self time, largest first (the LOG's breakdown)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(n_steps):
            step()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=20)


def worker(spec: dict) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from workers.models import build_model
    from workers.models.common import token_loss

    torch.manual_seed(0)
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    dev = torch.device(spec["device"])
    c, B, n, V = spec["config"], spec["batch"], spec["seq"], spec["vocab"]
    if spec["model"] in ("pt", "pt-store"):
        model = build_model(
            "pt",
            vocab_size=V,
            width=c["d"],
            base_width=c["d"],
            n_channels=c["h"],
            rank=c["r"],
            n_iter=c["T"],
            gamma=c["gamma"],
            dropout=spec["dropout"],
            recompute=spec["model"] == "pt",
        )
        flops = pt_flops(c["d"], c["h"], c["r"], c["T"], c["gamma"], n, V)
    else:
        model = make_ut(V, c["d"], c["h"], c["T"], n)
        flops = ut_flops(c["d"], c["h"], c["T"], n, V)
    model.to(dev).train()
    if spec.get("compile"):
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, n), generator=g)
    labels = torch.where(torch.rand(B, n, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    ids, labels = ids.to(dev), labels.to(dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    amp = spec.get("autocast", "none")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
            logits = model(ids)
        token_loss(logits.float(), labels).backward()
        opt.step()

    # matmul FLOPs torch itself counts, on a 2-sequence batch scaled to B: a check of the formula
    small = ids[:2]
    with FlopCounterMode(display=False) as fc, torch.autocast(dev.type, torch.bfloat16, enabled=amp == "bf16"):
        token_loss(model(small).float(), labels[:2]).backward()
    counted = fc.get_total_flops() * (B / small.shape[0]) / (B * n)
    model.zero_grad(set_to_none=True)

    if spec.get("profile"):
        step()  # warm-up outside the trace
        sync()
        profile = profile_steps(step, spec["profile"], dev.type)
        return {"config": spec["name"], "model": spec["model"], "profile": profile}
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated()
    else:
        base_mem = _rss_bytes()
    for _ in range(spec["warmup"]):
        step()
    sync()
    blocks = []
    for _ in range(spec["repeats"]):
        times = []
        for _ in range(spec["steps"]):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        blocks.append(times)
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else _peak_rss_bytes()
    medians = [statistics.median(b) for b in blocks]
    step_s = statistics.median(medians)
    tokens_s = B * n / step_s
    return {
        "config": spec["name"],
        "model": spec["model"],
        "params": sum(p.numel() for p in model.parameters()),
        "step_s": step_s,
        "step_s_block_medians": medians,
        "step_s_all": blocks,
        "tokens_per_s": tokens_s,
        "flops": flops,
        "flop_counter_train_per_token": counted,
        "achieved_flops": flops["train_per_token"] * tokens_s,
        "peak_mem_bytes": peak - base_mem,
        "mem_kind": "cuda max_memory_allocated delta" if dev.type == "cuda" else "peak RSS delta",
        "threads": torch.get_num_threads(),
        "loadavg_1min": os.getloadavg()[0],  # the machine's load at the end of this model's timing
    }


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------
def run_one(spec: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"worker {spec['name']}/{spec['model']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def device_error(device: str, compile_: bool) -> str | None:
    """Why this machine cannot run the requested device / compile mode (None when it can)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU-only build)"
        return (f"--device cuda: no CUDA device is visible to torch {torch.__version__} (CUDA build: {built}); "
                "run on a GPU machine or use --device cpu")
    if compile_ and not torch._dynamo.is_dynamo_supported():
        return f"--compile: torch.compile is not supported on Python {platform.python_version()}; drop --compile"
    return None


def table(results: list[dict]) -> str:
    enc = {r["config"]: r for r in results if r["model"] == "ut"}
    head = (
        "| config | model | params (M) | step ms (median [min–max of repeats]) | tokens/s "
        "| model GFLOP/token (train) | torch-counted / formula | achieved GFLOP/s | peak mem (MiB) "
        "| PT/encoder FLOP/s | load (1-min) |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for r in results:
        lo, hi = min(r["step_s_block_medians"]), max(r["step_s_block_medians"])
        ut = enc.get(r["config"])
        ratio = r["achieved_flops"] / ut["achieved_flops"] if ut else float("nan")
        name = {"pt": "PT", "pt-store": "PT (recompute=False)", "ut": "UT encoder"}[r["model"]]
        c = CONFIGS[r["config"]]
        label = f"{r['config']} (d={c['d']}, h={c['h']}, r={c['r']}, T={c['T']}, γ={c['gamma']})"
        ratio_s = f"{ratio:.3f}" if r["model"] != "ut" else "1"
        rows.append(
            f"| {label} | {name} | {r['params'] / 1e6:.2f} "
            f"| {r['step_s'] * 1e3:.0f} [{lo * 1e3:.0f}–{hi * 1e3:.0f}] | {r['tokens_per_s']:,.0f} "
            f"| {r['flops']['train_per_token'] / 1e9:.4f} "
            f"| {r['flop_counter_train_per_token'] / r['flops']['train_per_token']:.3f} "
            f"| {r['achieved_flops'] / 1e9:.1f} | {r['peak_mem_bytes'] / 2**20:,.0f} | {ratio_s} "
            f"| {r['loadavg_1min']:.1f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per repeat (≥ 5 recommended)")
    ap.add_argument("--ptb-steps", type=int, default=None, help="timed steps per repeat for the PTB config")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ptb-repeats", type=int, default=None, help="repeats for the PTB config")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--configs", default="small,ptb", help=f"comma-separated subset of {list(CONFIGS)}")
    ap.add_argument("--models", default="pt,ut", help="comma-separated subset of pt, pt-store, ut")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none", help="forward under torch.autocast")
    ap.add_argument("--compile", action="store_true", help="torch.compile each model (inductor)")
    ap.add_argument("--profile", type=int, default=0, help="profile this many steps per model and print the ops")
    ap.add_argument("--json", type=Path, default=None, help="write all results and the environment here")
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        print("RESULT " + json.dumps(worker(json.loads(args._worker))), flush=True)
        return

    import torch

    error = device_error(args.device, args.compile)
    if error:
        ap.error(error)
    loadavg_before = os.getloadavg()
    results = []
    for name in args.configs.split(","):
        steps = args.ptb_steps if (name == "ptb" and args.ptb_steps) else args.steps
        repeats = args.ptb_repeats if (name == "ptb" and args.ptb_repeats) else args.repeats
        for model in args.models.split(","):
            spec = {
                "name": name,
                "config": CONFIGS[name],
                "model": model,
                "device": args.device,
                "batch": args.batch,
                "seq": args.seq,
                "vocab": args.vocab,
                "dropout": args.dropout,
                "threads": args.threads,
                "warmup": args.warmup,
                "steps": steps,
                "repeats": repeats,
                "profile": args.profile,
                "autocast": args.autocast,
                "compile": args.compile,
            }
            t0 = time.time()
            results.append(run_one(spec))
            print(f"[{name}/{model}] done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            if args.profile:
                print(f"\n## {name}/{model}: {args.profile} steps, {args.threads or 'default'} threads\n")
                print(results[-1]["profile"], flush=True)
    if args.profile:
        return
    env = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else _cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": results[0]["threads"],
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "_worker"},
    }
    md = table(results)
    name_ptb = "ptb" in args.configs.split(",") and (args.ptb_steps or args.ptb_repeats)
    print(
        f"\nbatch {args.batch}, n = {args.seq}, |V| = {args.vocab}, standard parametrization, dropout "
        f"{args.dropout}, autocast {args.autocast}, compile {args.compile}, AdamW; "
        f"{args.device} ({env['threads']} threads, torch {torch.__version__}); "
        f"{args.warmup} warm-up + {args.repeats}×{args.steps} timed steps"
        + (f" (ptb: {args.ptb_repeats or args.repeats}×{args.ptb_steps or args.steps})" if name_ptb else "")
        + "\n"
    )
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"env": env, "results": results, "table": md}, indent=2))


if __name__ == "__main__":
    main()
