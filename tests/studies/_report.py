"""A report rendered as the driver renders it (`workers.driver.StudyDriver.write_report`), from typed results and
tables alone: each finished phase's section (`Phase.section`), the figures, the headline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from analysis import render_report
from studies.phases import PHASES, StudyState
from studies.phases.base import Context
from studies.spec import StudySpec


def phase_report(spec: StudySpec, results: Mapping[str, Mapping[str, Any]], study: Mapping[str, Any],
                 tables: Mapping[str, pd.DataFrame] | None = None, plots: Mapping[str, str] | None = None,
                 cost: Mapping[str, Any] | None = None) -> str:
    """The report of a study of `spec` whose phases finished with `results` (a phase → its result's fields)."""
    tables = dict(tables or {})
    state = StudyState(study_id="s", spec_hash="h", phases={p: {**r, "status": "done"} for p, r in results.items()})
    ctx = Context(spec, state, tables.get)
    return render_report(study=study, phases=list(PHASES), plots=plots or {}, tables=tables, cost=cost,
                         sections={p: PHASES[p].section(ctx, state.phases[p], tables) for p in results},
                         headline={k: v for p in PHASES.values() for k, v in p.headline.items()})
