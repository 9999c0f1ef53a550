"""Synthetic trial tables for the analysis tests: only the columns a test cares about need giving."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from studies.families.pt import HPARAMS

BASE = {
    "phase": "tune",
    "width": 64,
    "seed": 0,
    "status": "completed",
    "eval_loss": math.nan,
    "steps": 100,
    "tokens": 10_000,
    "wall_time_s": 1.0,
    "params": 1_000_000,
    "is_centre": False,
    "parametrization": "mup",
    **dict.fromkeys(HPARAMS, 1.0),
}


def trials(rows: Sequence[dict], **defaults: object) -> pd.DataFrame:
    """A trial table: each row is BASE, then `defaults`, then the row's own values."""
    records = [BASE | defaults | row for row in rows]
    for i, rec in enumerate(records):
        rec.setdefault("trial_id", f"t{i:03d}")
        rec.setdefault("best_eval_loss", rec["eval_loss"])
        if rec["status"] in ("diverged", "failed"):
            rec["eval_loss"] = math.nan
    return pd.DataFrame(records)


def verify_table(centre: Sequence[float], samples: Sequence[float | str]) -> pd.DataFrame:
    """Verify-phase rows: the centre's seeds, then one sample per value ('diverged'/'failed' as statuses)."""
    rows = [{"is_centre": True, "seed": s, "eval_loss": loss} for s, loss in enumerate(centre)]
    for value in samples:
        status = value if isinstance(value, str) else "completed"
        rows.append({"status": status, "eval_loss": math.nan if isinstance(value, str) else value})
    return trials(rows, phase="verify")


SWEEP_WIDTHS = [64, 128, 256, 512]
LOG2_LRS = list(range(-14, -3))  # lr = 2^-14 … 2^-4


def sweep_table(optimum_log2_lr, parametrizations=("mup", "standard"), seeds=(0, 1)) -> pd.DataFrame:
    """A validate sweep whose loss is a parabola in log2(lr) around optimum_log2_lr(param, width)."""
    rows = [
        {
            "parametrization": param,
            "width": width,
            "lr": 2.0**log2_lr,
            "seed": seed,
            "eval_loss": 3.0
            - 0.1 * np.log2(width)
            + 0.05 * (log2_lr - optimum_log2_lr(param, width)) ** 2
            + 0.001 * seed,
        }
        for param in parametrizations
        for width in SWEEP_WIDTHS
        for log2_lr in LOG2_LRS
        for seed in seeds
    ]
    return trials(rows, phase="validate")


def paper_like_optimum(param, width):
    """mup: flat at 2^-9; standard: 2^-8 at width 64, one octave lower per doubling."""
    return -9 if param == "mup" else -8 - np.log2(width / 64)


COORD_WIDTHS = [64, 128, 256, 512, 1024]
HIDDEN = ["z_logits.iter2", "head_logits.iter0", "msg_dep.iter1"]


def coord_table(exponents: dict[tuple[str, str], float], steps=(1, 2, 3), seeds=(0.9, 1.1)) -> pd.DataFrame:
    """rms = c·width^a per (parametrization, name), at every step; two 'seeds' scaled by 0.9 and 1.1."""
    rows = [
        {"parametrization": param, "name": name, "step": step, "width": w, "rms": factor * 3.0 * w**a}
        for (param, name), a in exponents.items()
        for step in steps
        for w in COORD_WIDTHS
        for factor in seeds
    ]
    return pd.DataFrame(rows)


def mup_like(hidden: float = 0.0, output: float = -1.0, param: str = "mup") -> dict:
    """Hidden activations at slope `hidden`, the output (mlm_logits) at slope `output`."""
    return {(param, name): hidden for name in HIDDEN} | {(param, "mlm_logits"): output}
