"""Parameter counts, FLOPs and the width-for-budget solver, computed from the architectures' shapes (no torch).

`param_count` equals `sum(p.numel() for p in model.parameters())` of the model `build_model` makes (a tied
decoder counted once; `tests/workers/test_budget_counts.py` checks it), from the same sizes at a width the models
are built with (`PTArch.at_width`, `heads_at`). FLOPs are the matmul FLOPs of the implementation as written, 2
per multiply-add, elementwise work left out; training FLOPs = 3 × forward × sequences seen. The per-family
formulas: docs/studies.md. Each family's counts live in its module (`studies.families.*`) and are registered with
it (`Family.param_count`, `forward_flops`); a family without them cannot join a compare study.
"""

from __future__ import annotations

from pydantic import BaseModel

from studies.arch import Arch, width_step
from studies.family import FAMILIES, Family, get_family

MAX_WIDTH = 1 << 16  # the solver's search limit


def _counted(family: str) -> Family:
    """`family`'s registration, which must carry its counts."""
    entry = get_family(family)
    if entry.param_count is None or entry.forward_flops is None:
        counted = [name for name, f in FAMILIES.items() if f.param_count is not None and f.forward_flops is not None]
        raise ValueError(f"model family {family!r} registers no parameter and FLOP counts (Family.param_count, "
                         f"Family.forward_flops): choose one of {counted}, or add the counts to its registration")
    return entry


def param_count(family: str, arch: BaseModel, width: int, vocab_size: int, base_width: int | None = None) -> int:
    """Parameters of `family`'s model at `width` (PT needs `base_width`, where its arch sizes are given)."""
    count = _counted(family).param_count
    assert count is not None  # `_counted` checks it
    return count(arch, width, vocab_size, base_width)


def forward_flops(family: str, arch: BaseModel, width: int, vocab_size: int, seq_len: int, n_decoded: float,
                  base_width: int | None = None) -> dict[str, float]:
    """Matmul FLOPs of one forward pass over one sequence, term by term (the terms: docs/studies.md)."""
    flops = _counted(family).forward_flops
    assert flops is not None  # `_counted` checks it
    return flops(arch, width, vocab_size, seq_len, n_decoded, base_width)


def train_flops(family: str, arch: BaseModel, width: int, vocab_size: int, seq_len: int, mask_rate: float,
                sequences: int, base_width: int | None = None) -> float:
    """Training FLOPs: 3 × the forward FLOPs of `sequences` sequences, mask_rate·seq_len decoded each."""
    fwd = forward_flops(family, arch, width, vocab_size, seq_len, mask_rate * seq_len, base_width)
    return 3.0 * sequences * sum(fwd.values())


def width_for_budget(family: str, arch: BaseModel, budget: float, vocab_size: int, base_width: int | None = None,
                     tolerance: float = 0.02) -> int:
    """The width whose parameter count is nearest `budget`; a `ValueError` if it misses by more than `tolerance`.

    Candidates are the widths `arch` builds at (PT: multiples of `width_step`; BERT, UT: every integer). The
    count grows with width, so the first width at or past the budget is found by bisection (a few dozen counts,
    whatever the budget), and the nearest is it or the width before it.
    """
    step = width_step(arch, base_width) if _counted(family).width_multiples and base_width is not None else 1

    def count_at(k: int) -> int:
        return param_count(family, arch, k * step, vocab_size, base_width)

    lo, hi = 1, MAX_WIDTH // step  # the first k with count_at(k) >= budget lies in [lo, hi]
    if count_at(hi) < budget:
        raise ValueError(f"no {family} width up to {MAX_WIDTH} reaches {budget:.3g} parameters")
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if count_at(mid) >= budget else (mid + 1, hi)
    width, count = lo * step, count_at(lo)
    below = (width - step, count_at(lo - 1)) if lo > 1 else None
    best, best_miss = width, abs(count - budget) / budget
    if below is not None and abs(below[1] - budget) / budget <= best_miss:  # a tie goes to the narrower width
        best, best_miss = below[0], abs(below[1] - budget) / budget
    if best_miss > tolerance:
        under = f"width {below[0]} has {below[1]:,}" if below else "no smaller width exists"
        over = f"width {width} has {count:,}"
        raise ValueError(
            f"no {family} width meets {budget:,.0f} parameters within {tolerance:.0%} ({under}; {over}; widths step "
            f"by {step}): move the budget, raise compare.tolerance, or pick an arch with a finer width step"
            + (arch.finer_steps if isinstance(arch, Arch) else ""))
    return best
