"""The verify phase's local-optimality certificate (PT spec §3.6, eqs. 8–9).

N hparam vectors are drawn around the transferred centre and trained at the verify width. If the centre is not
in the best fraction p of its neighbourhood, k of N samples beating it bound the fraction of better neighbours by
the one-sided Clopper–Pearson upper limit ((1-p)^N at k = 0). Seed noise alone makes samples "better", each with
probability q = Φ(-t / (σ·√(1+1/n_c))) for a sample as good as the centre; `noise_explains` says whether k fits
Binomial(N, q) and the best lead fits the largest of N noise differences (a union bound). The numbers and the
advice: docs/certificate.md.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.constants import check_probabilities, min_samples
from analysis.table import TrialStatus, judged_loss, phase_rows, require_columns

__all__ = ["Certificate", "certify", "confidence", "lead_text", "min_samples", "noise_better_rate", "noise_explains",
           "noise_lead", "noise_sd", "upper_bound", "verify_losses"]

Tolerance = Literal["seed_spread", "seed_noise"] | float


def confidence(n: int, p: float) -> float:
    """1-(1-p)^n: the confidence that the best of n samples lies in the top fraction p (eq. 8)."""
    return 1.0 - (1.0 - p) ** n


def upper_bound(k: int, n: int, alpha: float = 0.05) -> float:
    """One-sided (1-α) Clopper-Pearson upper bound on the fraction of neighbours better than the centre.

    One-sided because the claim is one-sided ("at most a fraction p is better"). The two-sided
    default of `binomtest` spends α/2 on each tail and is too wide: for 0 of 62 it gives 0.0578,
    which would wrongly fail a 5% certificate that the one-sided 0.0472 passes.
    """
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    from scipy.stats import binomtest  # here: SciPy's import is a second of every trial actor's start

    ci = binomtest(k, n, alternative="less").proportion_ci(confidence_level=1 - alpha, method="exact")
    return float(ci.high)


def noise_sd(seed_std: float, centre_seeds: int) -> float:
    """The sd of (one-seed sample - mean of the centre's seeds) for equally good hparams: σ·√(1+1/n_c)."""
    return seed_std * math.sqrt(1.0 + 1.0 / centre_seeds)


def noise_better_rate(tolerance: float, seed_std: float, centre_seeds: int) -> float | None:
    """q = Φ(-t / (σ·√(1+1/n_c))): the chance that a sample as good as the centre beats it by more than `tolerance`.

    σ is the centre's seed std. None when it cannot be estimated (one centre seed, or zero spread).
    """
    if centre_seeds < 2 or not seed_std > 0:
        return None
    from scipy.stats import norm  # here: SciPy's import is a second of every trial actor's start

    return float(norm.cdf(-tolerance / noise_sd(seed_std, centre_seeds)))


def noise_explains(k: int, n: int, rate: float | None, alpha: float = 0.05, lead: float | None = None) -> bool | None:
    """Whether seed noise alone can explain k better samples of n (module docstring).

    Args:
        k, n: the better samples and all judged samples.
        rate: `noise_better_rate`; None when it is unknown, and then so is the answer.
        alpha: k must be within the (1-α) quantile of Binomial(n, rate).
        lead: the best sample's lead over the centre's mean in noise sds ((centre - best) / `noise_sd`), if any: it
            must be at most Φ⁻¹(1-α/n).
    """
    if rate is None:
        return None
    from scipy.stats import binom, norm

    return bool(k <= binom.ppf(1.0 - alpha, n, rate) and (lead is None or lead <= norm.ppf(1.0 - alpha / n)))


def noise_lead(centre_loss: float, samples: pd.Series, sd: float) -> float | None:
    """The best finite sample's lead over the centre in noise sds; None with no finite sample or no noise sd."""
    finite = samples[np.isfinite(samples)]
    return None if finite.empty or not sd > 0 else (centre_loss - float(finite.min())) / sd


class Certificate(BaseModel):
    """The verify phase's verdict on the transferred centre."""

    n_samples: int  # N: judged samples (completed, stopped or diverged; failed runs are left out)
    n_better: int  # k: samples with eval_loss < centre_loss - tolerance
    p: float  # the top fraction claimed
    alpha: float  # 1 - the confidence level
    tolerance: float  # absolute margin in loss units a sample must beat the centre by
    tolerance_source: Literal["seed_spread", "seed_noise", "relative"]
    centre_loss: float  # mean eval loss over the centre's seeds
    centre_seed_std: float  # their standard deviation (ddof=1; 0 with one seed)
    centre_seeds: int
    confidence_if_none_better: float  # 1-(1-p)^N
    upper_bound: float  # one-sided Clopper-Pearson upper bound on the better fraction
    centre_rank: int  # 1-based rank of centre_loss among the N samples and the centre; ties favour the centre
    best_sample_loss: float | None  # None when every sample diverged
    best_relative_improvement: float | None  # (centre - best) / centre; positive = a sample beat the centre
    n_diverged: int  # diverged samples, counted as worse than the centre
    n_failed: int  # failed samples (infrastructure), left out of N
    certified: bool  # upper_bound <= p
    verdict: str
    # The seed-noise model (module docstring); None when the centre's seed std is unknown (one seed) or 0.
    # Defaults keep certificates written before these fields readable.
    noise_better_rate: float | None = None  # q: chance a sample as good as the centre counts as better
    noise_better_expected: float | None = None  # N·q
    noise_explains: bool | None = None  # k within Binomial(N, q)'s (1-alpha) quantile, the best lead within noise's
    # The best finite sample's lead over the centre (the paper: "≤ 0.4 % better"); None when every sample diverged
    best_lead: float | None = None  # centre_loss - best_sample_loss in nats; positive = the best sample beat the centre
    best_lead_pct: float | None = None  # 100 · best_lead / centre_loss


def verify_losses(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The verify phase's centre losses (finite) and sample losses (+inf for diverged).

    Both are indexed like `phase_rows(table, "verify")`.

    Raises a `ValueError` naming the fix when there is no usable centre run or no sample.
    """
    rows = phase_rows(table, "verify")
    require_columns(rows, ["is_centre", "status", "eval_loss"], "the certificate")
    is_centre = rows["is_centre"].eq(True)  # NaN (unset) counts as a sample, not the centre
    centre = judged_loss(rows[is_centre])
    if centre.empty:
        raise ValueError(
            "no usable centre run in the verify phase (rows with is_centre=True that did not fail): "
            "add the unperturbed centre's runs with is_centre=True"
        )
    if np.isinf(centre).any():
        raise ValueError(
            f"{int(np.isinf(centre).sum())} centre run(s) diverged: a diverged centre cannot be certified; "
            "inspect the transferred hparams (e.g. lower lr) before running the verify phase again"
        )
    samples = judged_loss(rows[~is_centre])
    if samples.empty:
        raise ValueError(
            "no perturbed samples in the verify phase (rows with is_centre=False that did not fail); "
            "run the verify phase's N samples"
        )
    return centre, samples


def certify(
    table: pd.DataFrame,
    *,
    p: float = 0.05,
    alpha: float = 0.05,
    tolerance: Tolerance = "seed_spread",
) -> Certificate:
    """Certify that the verify phase's centre is in the top fraction `p` of its neighbourhood, at confidence 1 - alpha.

    `tolerance` is the margin a sample must beat the centre's mean loss by to count as better: `"seed_spread"`, the
    centre's seed std s (ddof=1; 0 with one seed); `"seed_noise"`, 2·s·√(1+1/n_c), so that an equally good sample
    counts with probability Φ(-2) ≈ 2.3%; or a float, relative to the centre's loss (0.004 = the paper's 0.4%).
    """
    check_probabilities(p, alpha)
    centre, samples = verify_losses(table)
    centre_loss = float(centre.mean())
    seed_std = float(centre.std(ddof=1)) if len(centre) > 1 else 0.0
    source: Literal["seed_spread", "seed_noise", "relative"]
    if tolerance == "seed_spread":
        margin, source = seed_std, "seed_spread"
    elif tolerance == "seed_noise":
        margin, source = 2.0 * noise_sd(seed_std, len(centre)), "seed_noise"
    elif isinstance(tolerance, str):
        raise ValueError(f"tolerance must be 'seed_spread', 'seed_noise' or a relative float, got {tolerance!r}")
    else:
        if tolerance < 0:
            raise ValueError(f"a relative tolerance must be >= 0, got {tolerance}")
        margin, source = float(tolerance) * centre_loss, "relative"
    n, k = len(samples), int((samples < centre_loss - margin).sum())
    finite = samples[np.isfinite(samples)]
    best = float(finite.min()) if not finite.empty else None
    bound = upper_bound(k, n, alpha)
    rate = noise_better_rate(margin, seed_std, len(centre))
    lead = noise_lead(centre_loss, samples, noise_sd(seed_std, len(centre)))
    verify = phase_rows(table, "verify")
    cert = Certificate(
        n_samples=n,
        n_better=k,
        p=p,
        alpha=alpha,
        tolerance=margin,
        tolerance_source=source,
        centre_loss=centre_loss,
        centre_seed_std=seed_std,
        centre_seeds=len(centre),
        confidence_if_none_better=confidence(n, p),
        upper_bound=bound,
        centre_rank=1 + int((samples < centre_loss).sum()),
        best_sample_loss=best,
        best_relative_improvement=None if best is None else (centre_loss - best) / centre_loss,
        n_diverged=int(np.isinf(samples).sum()),
        n_failed=int(((verify["status"] == TrialStatus.FAILED) & ~verify["is_centre"].eq(True)).sum()),
        certified=bound <= p,
        verdict="",
        noise_better_rate=rate,
        noise_better_expected=None if rate is None else n * rate,
        noise_explains=noise_explains(k, n, rate, alpha, lead),
        best_lead=None if best is None else centre_loss - best,
        best_lead_pct=None if best is None else 100 * (centre_loss - best) / centre_loss,
    )
    return cert.model_copy(update={"verdict": _verdict(cert)})


def _pct(x: float) -> str:
    return f"{100 * x:g}%"


def lead_text(c: Certificate) -> str | None:
    """The best sample's lead over the centre in nats and % of the centre's loss (the paper's "best perturbed
    sample ≤ 0.4 % better than the centre"), or the centre's lead over every sample; None without a finite one."""
    if c.best_lead is None or c.best_lead_pct is None:
        return None
    if c.best_lead > 0:
        return f"the best sample is {c.best_lead:.3g} nats ({c.best_lead_pct:.2g} %) better than the centre"
    return f"the centre beats every sample, the best by {-c.best_lead:.3g} nats ({-c.best_lead_pct:.2g} %)"


def _verdict(c: Certificate) -> str:
    p, conf = _pct(c.p), _pct(1 - c.alpha)
    counts = f"{c.n_better} of {c.n_samples} samples beat it by more than {c.tolerance:.4g}"
    if c.n_diverged:
        counts += f"; {c.n_diverged} diverged, counted as worse"
    bound = f"one-sided upper bound on the better fraction {c.upper_bound:.4f}"
    lead = lead_text(c)
    lead = f"; {lead}" if lead else ""
    if c.certified:
        return f"centre is in the top {p} of its neighbourhood with confidence {conf} ({counts}; {bound}{lead})"
    noise = "" if c.noise_better_expected is None else (
        f"; seed noise alone would make ≈{c.noise_better_expected:.1f} of {c.n_samples} equally good samples beat it")
    return (
        f"centre is NOT certified in the top {p} of its neighbourhood at confidence {conf} "
        f"({counts}; {bound} > {c.p:g}{lead}{noise})"
    )
