"""One solo trial's training time in this process: the step of the trial loop, as every phase's trials run it.

A PT trial of cpu_demo's shape (μP, width 64, base 32, 2 channels, rank 8, 3 iterations, γ 2; the built-in
Shakespeare corpus at 60k words, |V| 2000, seq 64; batch 16, eval every 25 steps on 2 batches), or another
built-in family at its test size (`--model`). The data is prepared before the clock starts; the seconds printed
are `train_trial`'s alone. Compare two trees by running this file with each on PYTHONPATH, in turn:

    PYTHONPATH=. python benchmarks/bench_trial.py --steps 150
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_trial.py --steps 150

`--engine stacked` trains the same trial through the batched engine as a batch of one (`workers.batched.Stacked`),
the design the one loop did not take for a solo trial (docs/LOG.md).
"""

from __future__ import annotations

import argparse
import time

import torch

import workers.train
from studies.spec import DataSpec
from workers.batched import Stacked
from workers.train import TrialConfig, load_data, train_trial

HP = {"pt": {"width": 64, "base_width": 32, "n_channels": 2, "rank": 8, "n_iter": 3, "gamma": 2},
      "bert": {"width": 64, "base_width": 32, "head_dim": 16, "n_layers": 2, "max_len": 64}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(HP), default="pt")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", choices=["solo", "stacked"], default="solo", help="the loop's engine for K = 1")
    args = parser.parse_args()
    if args.engine == "stacked":
        workers.train.Solo = lambda cfg, vocab, device: Stacked([cfg], vocab, device)  # type: ignore[assignment,misc]
    torch.set_num_threads(args.threads)
    data = DataSpec(max_tokens=60_000, seq_len=64, vocab_size=2000)
    cfg = TrialConfig(model=args.model, model_hp={**HP[args.model], "parametrization": "mup"}, data=data, lr=1e-2,
                      steps=args.steps, batch_size=16, eval_every=25, eval_batches=2, log_every=25, warmup_steps=10)
    load_data(cfg.data)
    start = time.perf_counter()
    result = train_trial(cfg)
    print(f"{args.model} solo trial ({args.engine}): {args.steps} steps in {time.perf_counter() - start:.3f} s, "
          f"eval loss {result.eval_loss:.9f}")


if __name__ == "__main__":
    main()
