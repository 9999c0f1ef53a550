"""What a remote client may ask of the service: upper bounds on every size-like field of a `StudySpec`,
and the limits on a request itself. Each is a `PTCTL_MAX_*` variable (`Limits`, part of `Settings`); the defaults
and the fields each bounds: docs/control-plane.md and `FIELDS`.

`check(data, limits)` checks the raw parsed body before pydantic sees it: a bound is cheap to check and some
validation is not (a compare section solves a width per budget and family). A field over its bound is a 422 with
its path naming the variable that raises it. The local CLI applies none of these: its user owns the machine.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# field name → the `Limits` attribute that bounds it (the names are unique to their meaning across the spec)
FIELDS: dict[str, str] = {
    **dict.fromkeys(("base_width", "widths", "width"), "width"),
    **dict.fromkeys(("head_dim", "n_channels", "rank", "n_topics"), "arch"),
    **dict.fromkeys(("ffn_mult", "kv_group"), "mult"),
    **dict.fromkeys(("n_layers", "n_steps", "n_iter", "base_depth", "depths"), "layers"),
    **dict.fromkeys(("steps", "warmup_steps", "eval_every", "log_every", "plateau_patience", "grace_steps",
                     "stream_val_every", "recalibrate_every"), "steps"),
    "num_trials": "trials",
    "max_concurrent": "concurrent",
    "n_samples": "samples",
    **dict.fromkeys(("seeds", "centre_seeds"), "seeds"),
    **dict.fromkeys(("seed", "laplacian_seed"), "seed"),
    **dict.fromkeys(("seq_len", "max_len", "gamma"), "seq_len"),
    "vocab_size": "vocab",
    **dict.fromkeys(("batch_size", "batch_sizes"), "batch"),
    **dict.fromkeys(("eval_batches", "max_eval_sequences"), "eval"),
    **dict.fromkeys(("max_tokens", "tokens", "tune_tokens"), "tokens"),
    **dict.fromkeys(("budgets", "proxy_budget"), "params"),
    **dict.fromkeys(("gpus_per_trial", "transfer_gpus"), "gpus"),
    "cpus_per_trial": "cpus",
    "batch_members": "members",
}


class Limits(BaseSettings):
    """The `PTCTL_MAX_*` bounds (`FIELDS`; docs/control-plane.md); `Limits()` reads the environment."""

    model_config = SettingsConfigDict(env_prefix="PTCTL_MAX_", extra="ignore", frozen=True)

    width: int = Field(16384, gt=0)
    arch: int = Field(16384, gt=0)
    mult: int = Field(64, gt=0)
    layers: int = Field(256, gt=0)
    steps: int = Field(10_000_000, gt=0)
    trials: int = Field(10_000, gt=0)
    concurrent: int = Field(1024, gt=0)
    samples: int = Field(10_000, gt=0)
    seeds: int = Field(100, gt=0)
    seed: int = Field(2**32 - 1, gt=0)
    seq_len: int = Field(65536, gt=0)
    vocab: int = Field(1_000_000, gt=0)
    batch: int = Field(65536, gt=0)
    eval: int = Field(100_000, gt=0)
    tokens: int = Field(10**13, gt=0)
    params: float = Field(1e11, gt=0)
    gpus: float = Field(8, ge=0)
    cpus: float = Field(256, gt=0)
    members: int = Field(64, gt=0)
    list: int = Field(64, gt=0)
    header_bytes: int = Field(16384, ge=1024)
    nodes: int = Field(10_000, gt=0)
    depth: int = Field(32, gt=0)  # lists and maps inside each other: a StudySpec nests 6 deep
    parses: int = Field(4, gt=0)
    parse_s: float = Field(5.0, gt=0)


def _error(loc: tuple[Any, ...], msg: str, kind: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": kind}


def _over(loc: tuple[Any, ...], value: float, name: str, limits: Limits) -> dict[str, Any] | None:
    bound = getattr(limits, name)  # (inf and NaN are left to the finite-number check)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= bound:
        return None
    return _error(loc, f"{value:g} is over this service's limit of {bound:g}: lower it, or ask the operator to "
                       f"raise PTCTL_MAX_{name.upper()}", "limit")


def check(data: Any, limits: Limits, loc: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """The bounds `data` (the raw parsed body) breaks, as 422 error entries; [] when none."""
    errors: list[dict[str, Any]] = []
    if isinstance(data, list) and len(data) > limits.list:
        return [_error(loc, f"a list of {len(data)} items is over this service's limit of {limits.list}: shorten "
                            "it, or ask the operator to raise PTCTL_MAX_LIST", "limit")]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        name = FIELDS.get(key) if isinstance(key, str) else None
        if name is not None:
            values = enumerate(value) if isinstance(value, list) and len(value) <= limits.list else ()
            errors += [e for e in [_over((*loc, key), value, name, limits),
                                   *(_over((*loc, key, i), v, name, limits) for i, v in values)] if e]
        errors += check(value, limits, (*loc, key))
    return errors
