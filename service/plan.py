"""A study's wall-time estimate before it runs, for `ptctl study plan`, `ptctl transfer --dry-run` and
`POST /plans` (`workers.probe` times a few steps of each trial shape here; `studies.estimate` has the arithmetic).

Importing this module loads nothing heavy; the probe imports torch when it runs.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from service.schemas import StudyPlan
    from studies.estimate import Estimate
    from studies.spec import StudySpec

PROBING = threading.Lock()  # one probe at a time: two would share the cores and time each other
COMPARE_NOTE = ("not made for a compare study (its stages' widths come from the vocabulary): time a stage with "
                "ptctl train")


def estimate(spec: StudySpec, cpus: int | None = None) -> Estimate:
    """The probed estimate on this machine (`cpus`: the CPUs Ray gets; None: all of them); a `ValueError` for a
    compare study."""
    if spec.compare is not None:
        raise ValueError(COMPARE_NOTE)
    from workers.probe import estimate_here

    with PROBING:
        return estimate_here(spec, cpus)


def print_estimate(out: Console, spec: StudySpec) -> None:
    """The estimate's line, what it assumes on the next one, and a line for each trial shape it could not time."""
    if spec.compare is not None:
        out.print(f"estimate: {COMPARE_NOTE}", soft_wrap=True)
        return
    with out.status("timing a few steps of each trial shape on this machine…"):
        made = estimate(spec)
    out.print(made.line(), soft_wrap=True)
    out.print(f"assumes: {escape(made.assumptions)}", soft_wrap=True)
    for line in made.unprobed:
        out.print(f"not probed: {escape(line)}", soft_wrap=True)


def study_plan(spec: StudySpec, probe: bool = True, cpus: int | None = None) -> StudyPlan:
    """The API's plan: per phase the trials, steps and FLOPs of `studies.cost`, with the probed wall time unless
    `probe` is False; a `ValueError` naming the fix for a compare study."""
    from service.schemas import PhasePlan, StudyPlan
    from studies.cost import plan_cost, planned_runs
    from studies.family import get_family

    if spec.compare is not None:
        raise ValueError(f"the plan is {COMPARE_NOTE}; `ptctl study plan` lists a compare study's runs")
    if get_family(spec.model.family).forward_flops is None:
        phases = {p: PhasePlan(trials=len(r), steps=sum(s for _, s in r)) for p, r in planned_runs(spec).items()}
        shares: dict[int, float] = {}
    else:
        cost = plan_cost(spec)
        # the expectation of ASHA's steps is a sum of fractions: to the thousandth (100.00000000000001 is 100)
        phases = {p.phase: PhasePlan(trials=p.trials, steps=round(p.steps, 3), flops=p.flops) for p in cost.phases}
        shares = {w: 100 * cost.share(w, ("tune",)) for w in cost.targets}
    plan = StudyPlan(name=spec.name, spec_hash=spec.content_hash(), phases=phases, proxy_pct=shares)
    if not probe:
        return plan
    made = estimate(spec, cpus)
    for timed in made.phases:
        if timed.phase in phases:
            phases[timed.phase] = phases[timed.phase].model_copy(update={"lanes": timed.lanes,
                                                                         "seconds": timed.seconds})
    return plan.model_copy(update={"phases": phases, "total_s": made.total_s, "uncertainty": made.uncertainty,
                                   "assumptions": made.assumptions, "unprobed": made.unprobed,
                                   "line": made.line()})
