"""The compare table and figure over a synthetic compare-phase trial table."""

import math

import pandas as pd
import pytest

from analysis.family_ranking import compare_table, plot_compare
from analysis.report import compare_section, render_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def table() -> pd.DataFrame:
    rows = []
    for family, role, base in (("pt", "transferred", 5.0), ("bert", "tuned", 5.5), ("ut", "tuned", 5.2)):
        for i, budget in enumerate((1e5, 2e5)):
            for seed in range(3):
                rows.append({"trial_id": f"{family}-b{i}-s{seed}", "phase": "compare", "family": family, "role": role,
                             "budget": budget, "width": 32 * (i + 1), "params": int(budget * 1.01), "seed": seed,
                             "train_flops": 1e9 * (i + 1), "tokens": 1000, "status": "completed",
                             "eval_loss": base - 0.2 * i + 0.01 * seed})
    rows[0] |= {"status": "diverged", "eval_loss": math.nan}  # pt, budget 1e5, seed 0
    rows[-1] |= {"status": "failed", "eval_loss": math.nan}  # ut, budget 2e5, seed 2
    return pd.DataFrame(rows)


def test_compare_table_means_spreads_and_ranks():
    summary = compare_table(table())
    assert len(summary) == 6 and list(summary.columns[:3]) == ["family", "budget", "role"]
    pt = summary[(summary.family == "pt") & (summary.budget == 1e5)].iloc[0]
    assert (pt.n_seeds, pt.n_diverged, pt.n_failed) == (2, 1, 0)
    assert pt.eval_loss_mean == pytest.approx(5.015) and pt.eval_loss_std == pytest.approx(0.00707, rel=1e-3)
    ut = summary[(summary.family == "ut") & (summary.budget == 2e5)].iloc[0]
    assert (ut.n_seeds, ut.n_failed) == (2, 1) and ut.eval_loss_max == pytest.approx(5.01)
    for budget in (1e5, 2e5):
        ranked = summary[summary.budget == budget].sort_values("rank")
        assert list(ranked.family) == ["pt", "ut", "bert"] and list(ranked["rank"]) == [1, 2, 3]


def test_compare_table_needs_its_columns():
    with pytest.raises(ValueError, match=r"compare_table needs column\(s\) \['family'"):
        compare_table(table().drop(columns=["family"]))
    with pytest.raises(ValueError, match="no rows with phase='compare'"):
        compare_table(table().assign(phase="tune"))


def test_plot_compare_and_report_section(tmp_path):
    plot_compare(table(), tmp_path / "compare.png")
    data = (tmp_path / "compare.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    text = render_report(study={"name": "c", "families": ["pt", "bert", "ut"], "budgets": [1e5, 2e5]},
                         phases=["compare"], sections={"compare": [compare_section(table())]},
                         tables={"compare": table()}, plots={"compare": "compare.png"}, headline={})
    assert "## compare" in text and "5.0150 ± 0.0071" in text and "![compare](compare.png)" in text
    assert "- **families**: pt, bert, ut" in text
