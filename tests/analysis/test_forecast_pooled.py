"""The pooled conformal multiplier the forecast ships is the one `benchmarks/forecast_coverage.py` computes from the
trial tables stored in the repo (none while they hold fewer than 19 leave-out points)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from analysis.forecast import POOLED_MULTIPLIERS, conformal_quantile

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("forecast_coverage", ROOT / "benchmarks" / "forecast_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pooled_multiplier_is_the_stored_studies_quantile():
    bench = _benchmark()
    stored = [(spec, table) for spec, table in bench.STUDIES.values() if (ROOT / table).is_file()]
    assert ("studies/catalog/forecast_cpu.yaml", "docs/forecast/forecast_cpu_trials.csv") in stored
    scores = [abs(h.error_log2) / h.se for spec, table in stored for h in bench.score(spec, table, 0.95).points if h.se]
    q = conformal_quantile(scores, 0.95)  # None while the stored studies hold fewer than 19 points: none shipped
    assert ({} if q is None else {0.95: pytest.approx(q, abs=5e-4)}) == POOLED_MULTIPLIERS
