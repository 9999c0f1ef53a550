"""The mission's check through the study engine, in this process: `studies/catalog/paper_gpu.yaml` (tune μP-PT at
128, transfer to 1024, 62 samples at 1024) with the local runner, and one small JSON file of what it found.

Run by `benchmarks/gpu_mission.sh` (which installs what the machine lacks from a folder of wheels first);
`--smoke` runs the same path at toy sizes on this machine's CPU. The results file holds the certificate (samples,
how many beat the centre, the bound, the best sample's gain over the centre in %), the transferred hparams, each
phase's wall time and trials per hour, the model FLOP utilisation of the tune (width 128) and verify (width 1024)
phases against `--peak-tflops`, and the GPU's peak memory.

    python benchmarks/gpu_mission.py --out results.json [--peak-tflops 989] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from studies import load_catalog
from studies.cost import plan_cost
from studies.spec import StudySpec

SMOKE = {  # the same study at toy sizes: seconds a phase on 2 CPU cores
    "model": {"arch": {"n_channels": 2, "rank": 4, "n_iter": 2, "gamma": 1, "n_topics": 32}},
    "data": {"vocab_size": 500, "seq_len": 16, "max_tokens": 20_000, "max_eval_sequences": 16},
    "train": {"steps": 6, "batch_size": 4, "warmup_steps": 1, "eval_every": 3, "eval_batches": 1, "log_every": 3,
              "device": "cpu"},
    "tune": {"base_width": 16, "num_trials": 3},
    "transfer": {"widths": [32]},
    "verify": {"width": 32, "n_samples": 4, "centre_seeds": 2},
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def mission_spec(smoke: bool) -> StudySpec:
    spec = load_catalog("paper_gpu")
    return StudySpec.model_validate(_merged(spec.as_dict(), SMOKE)) if smoke else spec


def results(spec: StudySpec, state: Any, wall_s: float, peak_tflops: float | None, peak_bytes: int | None
            ) -> dict[str, Any]:
    """The results file's content from the finished study's state (module docstring)."""
    cert = state.phases["verify"].certificate
    planned = {p.phase: p for p in plan_cost(spec).phases}
    phases = {}
    for name, record in state.phases.items():
        wall, plan = record.wall_s, planned.get(name)
        if not wall or plan is None:
            continue
        achieved = plan.flops / wall
        phases[name] = {"wall_s": round(wall, 1), "trials": plan.trials,
                        "trials_per_hour": round(3600 * plan.trials / wall, 1), "tflops": round(achieved / 1e12, 3),
                        "mfu_pct": round(100 * achieved / (peak_tflops * 1e12), 3) if peak_tflops else None}
    gain = cert.best_relative_improvement
    return {
        "study": state.study_id, "status": str(state.status), "wall_s": round(wall_s, 1),
        "certificate": {"n_samples": cert.n_samples, "n_better": cert.n_better, "upper_bound": cert.upper_bound,
                        "certified": cert.certified, "tolerance": cert.tolerance,
                        "best_gain_over_centre_pct": None if gain is None else round(100 * gain, 3),
                        "paper": "no perturbation beat the centre by more than about 0.4 %"},
        "transferred_hparams": state.phases["tune"].best_hparams,
        "phases": phases, "mfu_widths": {"tune": spec.tune.base_width, "verify": spec.verify_width()},
        "peak_gpu_memory_gib": None if peak_bytes is None else round(peak_bytes / 2**30, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the results file (JSON)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU (H100: 989)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on this machine's CPU")
    args = parser.parse_args()
    import torch

    from workers.driver import run_study

    spec = mission_spec(args.smoke)
    start = time.monotonic()
    state = run_study(spec, "paper-gpu-smoke" if args.smoke else "paper-gpu")
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    found = results(spec, state, time.monotonic() - start, args.peak_tflops, peak)
    Path(args.out).write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
