"""Family-aware specs (BERT, UT), the compare section, the width-for-budget solver and the compare plan."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import studies
from studies.budget import param_count, train_flops, width_for_budget
from studies.families.bert import BertArch, BertConfig
from studies.families.encoder import BASELINE_HPARAMS, BaselineSpace
from studies.families.pt import PTArch, SearchSpace
from studies.families.ut import UTArch, UTConfig
from studies.phases import phases_of
from studies.phases.compare import compare_stages, compare_sub_spec, compare_trials, compare_widths
from studies.spec import StudySpec
from tests.studies._dicts import with_changes

MINIMAL = {"name": "demo", "tune": {"base_width": 16, "asha": {"grace_steps": 10}}, "transfer": {"widths": [32, 64]}}


def error_of(data: dict) -> str:
    with pytest.raises(ValidationError) as err:
        StudySpec.model_validate(data)
    return str(err.value)


def cpu() -> dict:
    return studies.load_catalog("compare_cpu").as_dict()


# ------------------------------------------------------------------------------------ family-aware specs
@pytest.mark.parametrize(("family", "arch_cls"), [("pt", PTArch), ("bert", BertArch), ("ut", UTArch)])
def test_model_family_picks_its_arch_and_space(family, arch_cls):
    spec = StudySpec.model_validate(with_changes(MINIMAL, **{"model.family": family}))
    assert isinstance(spec.model.arch, arch_cls)
    assert isinstance(spec.space, SearchSpace if family == "pt" else BaselineSpace)
    assert StudySpec.from_yaml(spec.to_yaml()) == spec


def test_bert_trial_config_carries_its_own_hparams():
    spec = StudySpec.model_validate(with_changes(MINIMAL, **{"model.family": "bert", "model.arch.n_layers": 3}))
    cfg = spec.trial_config(32, {"lr": 1e-3, "init_std": 0.1}, seed=1)
    assert (cfg["model"], cfg["lr"]) == ("bert", 1e-3)
    hp = cfg["model_hp"]
    assert (hp["n_layers"], hp["init_std"], hp["output_mult"], hp["base_width"]) == (3, 0.1, 1.0, 16)
    assert BertConfig(vocab_size=50, **hp).n_layers == 3  # the worker's config takes model_hp as it is
    ut = StudySpec.model_validate(with_changes(MINIMAL, **{"model.family": "ut"}))
    # every field but the vocabulary, and the depth fields, which a spec at depth_parametrization none leaves out
    depth_fields = {"depth_parametrization", "base_depth"}
    assert set(ut.model_hp(32, {})) == set(UTConfig.model_fields) - {"vocab_size"} - depth_fields
    deep = StudySpec.model_validate(with_changes(MINIMAL, **{"model.family": "ut", "model.arch.depth_parametrization":
                                                            "completep", "model.arch.base_depth": 2}))
    assert set(deep.model_hp(32, {})) == set(UTConfig.model_fields) - {"vocab_size"}


@pytest.mark.parametrize(
    ("changes", "needles"),
    [
        ({"model.family": "bert", "model.arch.n_iter": 3}, ["model.arch.n_iter", "Extra inputs"]),
        ({"model.family": "ut", "model.arch.timing": "rotary"}, ["model.arch.timing", "sinusoidal"]),
        ({"model.family": "bert", "space.w_H": {"low": 0.5, "high": 2}}, ["w_H", "init_std", "attn_mult"]),
        ({"model.family": "bert", "model.arch.max_len": 32}, ["data.seq_len 64 exceeds model.arch.max_len 32"]),
        ({"transfer": None}, ["verify needs a width"]),
    ],
)
def test_family_errors_name_the_field_and_fix(changes, needles):
    message = error_of(with_changes(MINIMAL, **changes))
    assert all(n in message for n in needles), message


def test_tune_only_study_and_baseline_space_defaults():
    spec = StudySpec.model_validate(with_changes(MINIMAL, transfer=None, verify=None, **{"model.family": "ut"}))
    assert phases_of(spec) == ["tune"]
    assert list(spec.space.defaults()) == list(BASELINE_HPARAMS)
    assert spec.space.defaults() == {"lr": 3e-3, "init_std": 0.05, "output_mult": 1.0, "attn_mult": 1.0}


def test_pt_specs_keep_their_dump():
    data = StudySpec.model_validate(MINIMAL).as_dict()
    assert "compare" not in data and data["model"]["family"] == "pt" and "w_H" in data["space"]


# ------------------------------------------------------------------------------------ the compare section
def test_compare_catalogs():
    spec = studies.load_catalog("compare_cpu")
    assert phases_of(spec) == ["compare"] and spec.verify is None and spec.transfer is None
    assert spec.compare.budgets == [2e5, 4e5, 8e5] and spec.compare.seeds >= 2
    assert (spec.steps_for("tune"), spec.steps_for("compare")) == (98, 196)
    paper = studies.load_catalog("compare_paper")
    assert (paper.data.path, paper.data.vocab_size) == ("JeanKaddour/minipile", 30522)
    assert paper.compare.budgets[0] == pytest.approx(1.7e7) and paper.compare.budgets[-1] == pytest.approx(3.76e8)
    assert compare_widths(paper, 30522)["pt"]["widths"] == [256, 512, 1024, 2048, 3072]  # PT's own counts


@pytest.mark.parametrize("name", ["compare_cpu", "compare_paper"])
def test_catalog_budgets_are_met_within_two_percent(name):
    spec = studies.load_catalog(name)
    vocab = spec.data.vocab_size
    for family, info in compare_widths(spec, vocab).items():
        arch = spec.model.arch if family == spec.model.family else next(
            b.model.arch for b in spec.compare.baselines if b.model.family == family)
        for width, budget in zip(info["widths"], spec.compare.budgets, strict=True):
            assert abs(param_count(family, arch, width, vocab, spec.tune.base_width) / budget - 1) <= 0.02


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"transfer": {"widths": [64]}}, "runs the compare phase only: remove ['transfer']"),
        ({"compare.baselines": [{"model": {"family": "pt"}}]}, "repeat one"),
        ({"compare.budgets": [4e5, 2e5]}, "strictly increasing"),
        ({"model.arch.paradigm": "channels"}, "no pt width meets 200,000 parameters within 2%"),
        ({"compare.baselines": []}, "compare.baselines"),
        ({"tune.asha.grace_steps": 200}, "tune.asha.grace_steps=200 exceeds the tune trials' 98 steps"),
        ({"tune.steps": 50}, "tune.steps is unused in a compare study"),
        ({"train.warmup_steps": 100}, "must be < the compare tune trials' 98 steps"),
    ],
)
def test_invalid_compare_sections(changes, needle):
    assert needle in error_of(with_changes(cpu(), **changes))


# ------------------------------------------------------------------------------------ the solver
@pytest.mark.parametrize("family", ["pt", "bert", "ut"])
def test_solver_hits_budgets_within_two_percent(family):
    spec = studies.load_catalog("compare_cpu")
    arch = spec.model.arch if family == "pt" else next(
        b.model.arch for b in spec.compare.baselines if b.model.family == family)
    for budget in (1.5e5, 3e5, 6e5, 1.2e6, 5e6):
        width = width_for_budget(family, arch, budget, 2000, 32)
        count = param_count(family, arch, width, 2000, 32)
        assert abs(count / budget - 1) <= 0.02
        step = 2 if family == "pt" else 1  # r = width/2: PT's widths are even
        neighbours = [w for w in (width - 2 * step, width - step, width + step, width + 2 * step) if w > 0]
        assert all(abs(count - budget) <= abs(param_count(family, arch, w, 2000, 32) - budget) for w in neighbours)


def test_solver_errors_name_the_fix():
    arch = PTArch(n_channels=2, rank=8, paradigm="channels")  # widths step by 16
    with pytest.raises(ValueError, match=r"within 2%.*widths step by 16.*paradigm 'rank'"):
        width_for_budget("pt", arch, 2.4e5, 2000, 32)
    with pytest.raises(ValueError, match="pass base_width="):
        width_for_budget("pt", arch, 2.4e5, 2000)
    assert width_for_budget("pt", arch, 2.4e5, 2000, 32, tolerance=0.2) % 16 == 0


# ------------------------------------------------------------------------------------ the plan
def test_pt_is_tuned_once_at_its_proxy_with_the_base_moved_there():
    spec = studies.load_catalog("compare_cpu")
    stages = compare_stages(spec, 2000)
    assert [s.name for s in stages] == ["pt-proxy", "bert-b0", "bert-b1", "bert-b2", "ut-b0", "ut-b1", "ut-b2"]
    pt = stages[0].spec
    width = compare_widths(spec, 2000)["pt"]["proxy_width"]
    assert pt.tune.base_width == width and pt.model.arch.rank == 16 * width // 32  # r = width/2 as at base 32
    assert phases_of(pt) == ["tune"] and pt.steps_for("tune") == 98 and pt.train.steps == 196
    bert = compare_sub_spec(spec, "bert", 90)
    assert bert.model.family == "bert" and bert.space.frozen == ["attn_mult"] and bert.tune.num_trials == 5
    with pytest.raises(ValueError, match="family 'tauformer' is not in this compare study"):
        compare_sub_spec(spec, "tauformer", 64)


def test_final_trials_use_proxy_hparams_for_pt_and_per_budget_ones_for_baselines():
    spec = studies.load_catalog("compare_cpu")
    best = {s.name: {"lr": 0.001 * (i + 1)} for i, s in enumerate(compare_stages(spec, 2000))}
    trials = compare_trials(spec, 2000, best)
    assert len(trials) == 3 * 3 * 3 and len({t.trial_key for t in trials}) == len(trials)
    pt = [t for t in trials if t.family == "pt"]
    assert {t.hparams["lr"] for t in pt} == {0.001} and {t.config["model_hp"]["base_width"] for t in pt} == {44}
    assert sorted({t.width for t in pt}) == compare_widths(spec, 2000)["pt"]["widths"]
    bert = [t for t in trials if t.family == "bert"]
    assert sorted({t.hparams["lr"] for t in bert}) == [0.002, 0.003, 0.004]
    for t in trials:
        assert t.config["steps"] == 196 and t.config["model"] == t.family
        assert t.config["model_hp"]["width"] == t.width and t.train_flops > 0
    for family in ("pt", "bert", "ut"):
        flops = sorted({t.budget: t.train_flops for t in trials if t.family == family}.items())
        assert [f for _, f in flops] == sorted(f for _, f in flops)  # more parameters, more FLOPs


def test_train_flops_scale_with_tokens_and_pt_iterations():
    arch = PTArch(n_channels=2, rank=16, paradigm="rank", n_iter=3, gamma=2)
    one = train_flops("pt", arch, 64, 2000, 64, 0.15, 100, 32)
    assert train_flops("pt", arch, 64, 2000, 64, 0.15, 200, 32) == pytest.approx(2 * one)
    more = train_flops("pt", arch.model_copy(update={"n_iter": 6}), 64, 2000, 64, 0.15, 100, 32)
    decoder = 3 * 100 * 2 * 0.15 * 64 * 64 * 2000
    assert more - decoder == pytest.approx(2 * (one - decoder))
