"""A tiny compare study end to end: 3 families × 2 budgets through real Ray Tune and MLflow on SQLite."""


import pandas as pd
import pytest

from studies import load_catalog, param_count
from studies.spec import StudySpec

pytestmark = pytest.mark.slow
BUDGETS = [25_000, 55_000]  # widths meeting both within 2% at a 500-word vocabulary


@pytest.fixture(scope="module")
def data_dir(study_data_dir):
    return study_data_dir


def tiny_compare() -> StudySpec:
    """compare_cpu shrunk: 500 words, 32-token sequences, 2 tune trials per stage, 5-step tunes, 10-step runs."""
    data = load_catalog("compare_cpu").as_dict()
    data["name"] = "tiny-compare"
    data["data"].update(vocab_size=500, seq_len=32, max_tokens=60_000, max_eval_sequences=32)
    data["train"].update(batch_size=8, warmup_steps=2, eval_every=5, eval_batches=2, log_every=5)
    data["tune"].update(num_trials=2, asha={"enabled": False})
    data["compare"].update(budgets=BUDGETS, proxy_budget=BUDGETS[0], tokens=8 * 32 * 10, tune_tokens=8 * 32 * 5,
                           seeds=2)
    for baseline in data["compare"]["baselines"]:
        baseline["num_trials"] = 2
        baseline["model"]["arch"]["max_len"] = 32
    return StudySpec.model_validate(data)


@pytest.fixture(scope="module")
def compare_study(data_dir):
    from workers.driver import run_study

    spec = tiny_compare()
    state = run_study(spec, "cmp")
    return spec, state, data_dir / "studies" / "cmp" / "artifacts"


def test_every_family_trains_at_every_budget(compare_study):
    spec, state, art = compare_study
    assert state.status == "succeeded" and state.done("compare")
    trials = pd.read_csv(art / "compare_trials.csv")
    assert len(trials) == 3 * len(BUDGETS) * 2 and (trials.status == "completed").all()
    assert set(trials.family) == {"pt", "bert", "ut"} and sorted(trials.budget.unique()) == BUDGETS
    assert (trials.steps == spec.steps_for("compare")).all() and trials.tokens.nunique() == 1  # one token budget
    vocab = state.phases["compare"].vocab_size
    for row in trials.itertuples():  # the trainer's own count is the solver's, within the tolerance
        arch = spec.model.arch if row.family == "pt" else next(
            b.model.arch for b in spec.compare.baselines if b.model.family == row.family)
        assert row.params == param_count(row.family, arch, row.width, vocab, spec.tune.base_width)
        assert abs(row.params / row.budget - 1) <= spec.compare.tolerance


def test_pt_is_tuned_once_and_baselines_at_every_budget(compare_study):
    spec, state, art = compare_study
    stages = state.phases["compare"].stages
    assert sorted(stages) == ["bert-b0", "bert-b1", "pt-proxy", "ut-b0", "ut-b1"]
    tunes = pd.read_csv(art / "compare_tune_trials.csv")
    assert len(tunes) == spec.tune.num_trials + 2 * 2 * 2
    trials = pd.read_csv(art / "compare_trials.csv")
    pt = trials[trials.family == "pt"]
    assert set(pt.tuned_at) == {"pt-proxy"} and pt.lr.nunique() == 1  # zero-shot: one lr at every width
    assert pt.lr.iloc[0] == pytest.approx(stages["pt-proxy"].best_hparams["lr"])
    assert pt.width.nunique() == len(BUDGETS)
    for row in trials[trials.family != "pt"].itertuples():
        stage = f"{row.family}-b{BUDGETS.index(row.budget)}"
        assert row.tuned_at == stage and row.lr == pytest.approx(stages[stage].best_hparams["lr"])
        assert row.init_std == pytest.approx(stages[stage].best_hparams["init_std"])


def test_table_plot_and_report(compare_study):
    _, _, art = compare_study
    summary = pd.read_csv(art / "compare_summary.csv")
    assert len(summary) == 3 * len(BUDGETS) and (summary.n_seeds == 2).all()
    assert summary.eval_loss_mean.notna().all() and (summary.eval_loss_std >= 0).all()
    assert (summary.groupby("budget")["rank"].apply(sorted).apply(list) == [[1, 2, 3]] * len(BUDGETS)).all()
    assert (summary.train_flops > 0).all()
    assert (art / "compare.png").stat().st_size > 10_000
    report = (art / "report.md").read_text()
    assert "## compare" in report and "![compare](compare.png)" in report and "train_flops" in report


def test_mlflow_trial_runs_nest_under_the_compare_phase(compare_study):
    from workers.mlflow_tracker import Tracker

    spec, state, _ = compare_study
    tracker = Tracker(spec.experiment_name())
    phases = tracker.runs("cmp", "phase")
    assert [r.data.tags["phase"] for r in phases] == ["compare"]
    trials = tracker.runs("cmp", "trial")
    assert len(trials) == spec.tune.num_trials + 2 * 2 * 2 + 3 * len(BUDGETS) * 2
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {phases[0].info.run_id}
    assert {r.data.tags["family"] for r in trials} == {"pt", "bert", "ut"}
    assert all(r.data.tags["phase"] == "compare" for r in trials)
