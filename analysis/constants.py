"""The parts of `analysis` that need no numpy, pandas or scipy: the trial table's vocabulary, a sweep's `Axis` and
the certificate's sample-size rule (eq. 9). `studies` imports these at import time; keeping them here keeps
`import studies` (and so `ptctl --help`) free of the numerical stack.
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

ATTENTION = "attn_logits."
"""The trace names' prefix of attention logits (`workers.attention`, the built-ins' own traces): the coordinate
check names the layer and the fix when they grow with width."""


class TrialStatus(StrEnum):
    """A trial's status, the table's `status` column (and the `status` tag of its MLflow run).

    `completed`: ran its full budget; `stopped`: ended early by ASHA (its loss is real, its budget short);
    `diverged`: NaN/inf or blown-up loss; `failed`: the infrastructure failed it (retries used up);
    `running`: not finished yet (live MLflow runs only, never in a finished table)."""

    COMPLETED = "completed"
    DIVERGED = "diverged"
    STOPPED = "stopped"
    FAILED = "failed"
    RUNNING = "running"


STATUSES: tuple[str, ...] = tuple(s.value for s in TrialStatus if s is not TrialStatus.RUNNING)  # the finished ones
LOSS_STATUSES: frozenset[TrialStatus] = frozenset({TrialStatus.COMPLETED, TrialStatus.STOPPED})  # a real eval loss

_EPS = 1e-9


def min_samples(p: float = 0.05, alpha: float = 0.05) -> int:
    """The smallest N with 1-(1-p)^N ≥ 1-α, i.e. ceil(ln α / ln(1-p)) (eq. 9): 59 for p=α=0.05.

    A ratio that is an integer up to rounding (e.g. p=0.01, α=0.99² → 2.000000000000001) is
    taken as that integer rather than rounded up past it.
    """
    check_probabilities(p, alpha)
    ratio = math.log(alpha) / math.log1p(-p)  # log1p: a p below float epsilon still counts
    nearest = round(ratio)
    return int(nearest) if abs(ratio - nearest) < _EPS else math.ceil(ratio)


def check_probabilities(p: float, alpha: float) -> None:
    if not (0 < p < 1 and 0 < alpha < 1):
        raise ValueError(f"p and alpha must lie strictly between 0 and 1, got p={p}, alpha={alpha}")


class Axis(BaseModel):
    """What a drift is measured along (a validate sweep's, `studies.sweeps`): its name (`LRDrift.axis`), the trial
    table's column of its value, its words ("per doubling of <words>"), and the parametrization judged with the one
    shown beside it (along depth the `parametrization` column holds the depth parametrization)."""

    model_config = ConfigDict(frozen=True)

    name: str
    column: str
    words: str
    judged: tuple[str, str] = ("mup", "standard")


WIDTH = Axis(name="width", column="width", words="width")
"""The width: the μTransfer axis, and every other axis's drift is measured at one width."""
