"""Coordinate check: the RMS of every traced activation over the first optimiser steps, per width.

Under μP each activation's RMS stays flat as width grows; under the standard parametrization
some grow. Step t is measured after t optimiser updates (t = 0 is initialisation), with the
same data batches at every width and seeds averaged. The slopes and the verdict are computed
by `analysis.coord` from the returned table.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import torch

from workers.data import DataConfig
from workers.models import build_model, objective_of
from workers.models.pt import mlm_loss
from workers.train import TrialConfig, load_data, make_optimizer

# Small models per family. PT: h = 2, r = 8 at the base width, widened by the paradigm. TauGPT: heads of 16
# dims (the Laplacian's size), widened by heads, every hparam at its default. BERT and UT:
# heads of 16 dims (2 heads at width 32, 16 at 256), positions for the check's 32-token sequences, and
# init_std 0.15 at the base width 32 (≈ 0.85/√32, the order of BERT's 0.02 ≈ 0.55/√768 relative to fan-in;
# with 0.02 the random part is so small at d0 = 32 that the attention logits of the first updates shrink
# with width at these widths: slopes to −0.6 under μP, measured in docs/LOG.md).
FAMILY_HP: dict[str, dict] = {
    "pt": {"n_channels": 2, "rank": 8, "n_iter": 3, "gamma": 3},
    "bert": {"n_layers": 2, "head_dim": 16, "max_len": 32, "init_std": 0.15},
    "ut": {"n_steps": 3, "head_dim": 16, "max_len": 32, "init_std": 0.15},
    "tauformer": {"n_layers": 2, "head_dim": 16, "max_len": 32},  # widens by heads: 2 heads at 32, 16 at 256
}
DEFAULT_HP = FAMILY_HP["pt"]
DEFAULT_DATA = DataConfig(max_tokens=200_000, seq_len=32)


def coord_data(
    model: str = "pt",
    parametrization: str = "mup",
    widths: tuple[int, ...] = (32, 64, 128, 256),
    steps: int = 4,
    lr: float = 1e-2,
    batch_size: int = 16,
    seeds: int = 3,
    model_hp: dict | None = None,
    data: DataConfig = DEFAULT_DATA,
) -> pd.DataFrame:
    """Rows (parametrization, width, step, name, rms), averaged over `seeds` model seeds."""
    if model not in FAMILY_HP:
        raise ValueError(f"no coordinate-check defaults for model {model!r}: choose one of {sorted(FAMILY_HP)}")
    hp = {**FAMILY_HP[model], **(model_hp or {})}
    hp.setdefault("base_width", min(widths))
    data = replace(data, objective=objective_of(model))  # TauGPT: causal LM batches
    cfg = TrialConfig(model=model, data=data, lr=lr, batch_size=batch_size, weight_decay=0.0, grad_clip=0.0)
    mlm = load_data(data)
    rows = []
    for width in widths:
        for seed in range(seeds):
            torch.manual_seed(seed)
            net = build_model(model, vocab_size=mlm.vocab_size, width=width, parametrization=parametrization, **hp)
            opt = make_optimizer(net, replace(cfg, seed=seed))
            batches = mlm.train_batches(batch_size, seed=1000 + seed)  # same batches at every width
            for step in range(steps):
                batch = next(batches)
                if hasattr(net, "calibrate"):  # TauGPT: τ from the first batch, as in training
                    net.calibrate(batch.input_ids, step)
                trace: dict[str, torch.Tensor] = {}
                logits = net(batch.input_ids, batch.attention_mask, trace=trace)
                for name, act in trace.items():
                    rms = float(act.detach().float().pow(2).mean().sqrt())
                    rows.append((parametrization, width, seed, step, name, rms))
                opt.zero_grad(set_to_none=True)
                loss = mlm_loss(logits, batch.labels)
                if hasattr(net, "aux_loss"):
                    loss = loss + net.aux_loss()
                loss.backward()
                opt.step()
    df = pd.DataFrame(rows, columns=["parametrization", "width", "seed", "step", "name", "rms"])
    return df.groupby(["parametrization", "width", "step", "name"], as_index=False)["rms"].mean()
