"""`train.optimizer: muon` (`workers.muon`): Muon on each family's hidden matrices, AdamW beside them, μP for Muon.

ptctl's Muon step equals torch.optim.Muon on a matrix (both adjust_lr_fn rules, decay and Nesterov on and off); a
stack of matrices is orthogonalised matrix by matrix; each family's groups decide what Muon takes (embeddings,
readout, vectors and PT's diagonal W stay on AdamW); the μP rule (spectral condition, anchored at the base width)
gives each matrix its factor; a batched trial's members equal their solo trials under Muon; a checkpoint resumes
Muon's momentum; specs without the fields keep their content hash, and a Muon knob without Muon is refused.
"""

import math

import pandas as pd
import pytest
import torch

from studies.family import get_family
from studies.spec import CATALOG_DIR, MUON_KNOBS, StudySpec, TrainSpec
from tests.studies.test_weight_decay import HASHES
from tests.workers.test_batched import (
    BERT,
    CLM,
    DATA,
    ENC_MEMBERS,
    PT,
    PT_MEMBERS,
    TAU,
    TAU_MEMBERS,
    _assert_equal,
    _saved,
)
from tests.workers.test_batched import _configs as batch_configs
from tests.workers.test_mup_family import _model as mup_model
from workers.errors import ConfigError
from workers.models import build_model
from workers.muon import MuonAdamW, adjust, orthogonalize
from workers.train import TrialConfig, make_optimizer, train, train_trial


def _groups(family, width, base, parametrization="mup", **train_kw):
    hp = {**PT, "width": width, "base_width": base, "parametrization": parametrization} if family == "pt" else \
        {**BERT, "width": width, "base_width": base, "parametrization": parametrization}
    net = build_model(family, vocab_size=100, **hp)
    cfg = TrialConfig(model=family, model_hp=hp, lr=1e-2, optimizer="muon", **train_kw)
    names = {id(p): n for n, p in net.named_parameters()}
    groups = make_optimizer(net, cfg).param_groups
    return {g["name"]: {**g, "names": [names[id(p)] for p in g["params"]]} for g in groups}


@pytest.mark.parametrize("rule", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", [(48, 24), (24, 48), (32, 32)])
def test_the_muon_step_equals_torchs_on_a_matrix(rule, nesterov, shape):
    torch.manual_seed(0)
    w = torch.randn(*shape)
    ours_w, ref_w = w.clone().requires_grad_(), w.clone().requires_grad_()
    cfg = TrialConfig(lr=0.02, optimizer="muon", muon_adjust_lr=rule, muon_nesterov=nesterov, muon_momentum=0.9,
                      muon_ns_steps=4)
    ours = MuonAdamW([{"params": [ours_w], "lr": 0.02, "muon": True, "weight_decay": 0.1, "name": "hidden",
                       "scales": [adjust(rule, *shape)], "decays": [1.0], "fan_in_dims": [-1]}], cfg, 1e-8)
    ref = torch.optim.Muon([ref_w], lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, ns_steps=4,
                           adjust_lr_fn=rule)
    for _ in range(4):
        g = torch.randn(*shape)
        ours_w.grad, ref_w.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.equal(ours_w, ref_w)
    assert not torch.equal(ours_w, w)


def test_a_stack_is_orthogonalised_matrix_by_matrix_and_an_in_out_layout_as_its_transpose():
    g = torch.randn(3, 2, 40, 12)
    stacked = orthogonalize(g, 5, fan_in_dim=-2)
    for i in range(3):
        for j in range(2):
            assert torch.equal(stacked[i, j], orthogonalize(g[i, j].T, 5).T)
    singular = torch.linalg.svdvals(stacked[0, 0].float())
    assert singular.max() < 1.6 and singular.min() > 0.4  # Muon's US'Vᵀ: S' within about (0.5, 1.5)


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    groups = _groups("bert", 64, 32)
    assert groups["hidden"]["muon"] and all(n.endswith(".weight") for n in groups["hidden"]["names"])
    assert {"input", "bias"} <= set(groups) and not any(groups[g].get("muon") for g in ("input", "bias"))
    assert "tok_emb.weight" in groups["input"]["names"]
    hp = {**PT, "width": 32, "base_width": 16, "parametrization": "standard", "decomposition": "uvw"}
    net = build_model("pt", vocab_size=100, **hp)
    opt = make_optimizer(net, TrialConfig(model="pt", model_hp=hp, lr=1e-2, optimizer="muon"))
    names = {id(p): n for n, p in net.named_parameters()}
    by_name = {g["name"]: [names[id(p)] for p in g["params"]] for g in opt.param_groups}
    assert by_name["hidden"] == ["U", "V"] and by_name["hidden_adamw"] == ["W"]  # W: a per-channel diagonal
    assert by_name["output"] == ["decoder.weight"] and by_name["input"] == ["unary.weight"]
    pt = _groups("pt", 32, 16)
    assert pt["hidden"]["lr"] == 1e-2 and pt["output"]["lr"] == pytest.approx(1e-2 / 2)  # Adam's μP beside Muon
    assert pt["input"]["lr"] == 1e-2 and not pt["output"].get("muon")


def test_the_mup_rule_is_the_spectral_condition_anchored_at_the_base_width():
    for width in (32, 64, 128):  # BERT: every hidden matrix's fans grow with width, so its factor stays
        hidden = _groups("bert", width, 32)["hidden"]
        base = {n: s for n, s in zip(hidden["names"], _groups("bert", 32, 32)["hidden"]["scales"], strict=True)}
        assert [base[n] for n in hidden["names"]] == pytest.approx(hidden["scales"])
    wide, narrow = _groups("bert", 128, 32, weight_decay=0.1)["hidden"], _groups("bert", 32, 32)["hidden"]
    q = wide["names"].index("layers.0.q.weight")
    assert narrow["scales"][q] == pytest.approx(0.2 * math.sqrt(32))  # match_rms_adamw at the base width
    assert wide["decays"][q] == pytest.approx(0.5)  # coupled decay follows the corrected lr: 1/√width_mult
    standard = _groups("bert", 128, 32, "standard")["hidden"]
    assert standard["scales"][q] == pytest.approx(0.2 * math.sqrt(128))  # torch's rule at every width
    for width in (16, 32, 64):  # PT, channels: U is (d, r) at a fixed rank, so ‖ΔU‖ ∝ √(r/d)
        pt = _groups("pt", width, 16)["hidden"]
        assert pt["scales"][0] == pytest.approx(0.2 * math.sqrt(16) * math.sqrt(16 / width))
    independent = _groups("bert", 128, 32, weight_decay=0.1, weight_decay_form="independent")["hidden"]
    assert independent["weight_decay"] == pytest.approx(0.1) and set(independent["decays"]) == {1.0}


def test_original_keeps_keller_jordans_factor_for_width_growing_matrices():
    hidden = _groups("bert", 128, 32, muon_adjust_lr="original")["hidden"]
    ff1, ff2 = hidden["names"].index("layers.0.ff1.weight"), hidden["names"].index("layers.0.ff2.weight")
    assert hidden["scales"][ff1] == pytest.approx(2.0) and hidden["scales"][ff2] == pytest.approx(1.0)


@pytest.mark.parametrize(("family", "hp", "data", "members"), [
    ("pt", PT, DATA, PT_MEMBERS), ("bert", BERT, DATA, ENC_MEMBERS), ("tauformer", TAU, CLM, TAU_MEMBERS)])
def test_batched_members_equal_their_solo_trials_under_muon(family, hp, data, members):
    cfgs = batch_configs(family, {**hp, "parametrization": "mup"}, data, members, optimizer="muon",
                         weight_decay=0.05)
    _assert_equal(cfgs, rel=1e-3)


@pytest.mark.parametrize("members", [ENC_MEMBERS[:1], ENC_MEMBERS])
def test_a_resumed_muon_trial_or_batch_ends_where_an_undisturbed_one_ends(members):
    cfgs = batch_configs("bert", {**BERT, "parametrization": "mup"}, DATA, members, optimizer="muon")
    saved = {}

    def keep(rows, state):
        if state["step"] == 10:
            saved["state"] = torch.load(_saved(state), weights_only=True)

    whole = train(cfgs, checkpoint=keep)
    momentum = saved["state"]["engine"]["optimizer"]
    assert momentum["momentum"] if len(members) > 1 else \
        any("momentum_buffer" in s for s in momentum["state"].values())
    for one, other in zip(whole, train(cfgs, resume=saved["state"]), strict=True):
        assert other.eval_loss == pytest.approx(one.eval_loss, rel=1e-6)


def test_muon_trains_a_trial_and_moves_it_apart_from_adamw():
    base = batch_configs("pt", {**PT, "parametrization": "mup"}, DATA, PT_MEMBERS[:1])[0]
    muon = train_trial(base.model_copy(update={"optimizer": "muon"}))
    adamw = train_trial(base)
    assert muon.status == "completed" and muon.eval_loss < muon.rows[0]["train_loss"]
    assert muon.eval_loss != adamw.eval_loss


@pytest.mark.parametrize("file", sorted(HASHES))
def test_catalog_studies_keep_their_hash_and_dump_no_optimizer_field(file):
    spec = StudySpec.from_yaml(CATALOG_DIR / file)
    assert spec.content_hash() == HASHES[file]
    assert not {"optimizer", *MUON_KNOBS} & set(spec.as_dict()["train"])


def test_muon_changes_the_hash_round_trips_and_its_knobs_need_it():
    spec = StudySpec.from_yaml(CATALOG_DIR / "tiny.yaml")
    muon = spec.model_copy(update={"train": spec.train.model_copy(update={"optimizer": "muon"})})
    assert muon.content_hash() != HASHES["tiny.yaml"]
    assert StudySpec.from_yaml(muon.to_yaml()) == muon
    assert "muon_ns_steps" in TrainSpec(optimizer="muon", muon_ns_steps=3).model_dump()
    with pytest.raises(ValueError, match=r"train.muon_momentum is a knob of Muon.*set train.optimizer: muon"):
        TrainSpec(muon_momentum=0.9)
    with pytest.raises(ValueError, match="muon_ns_steps"):
        TrainSpec(optimizer="muon", muon_ns_steps=100)


def test_hf_trains_its_hidden_matrices_with_muon():
    hp = {"width": 64, "base_width": 32, "parametrization": "mup", **get_family("hf").coord_hp}
    net = build_model("hf", vocab_size=100, **hp)
    opt = make_optimizer(net, TrialConfig(model="hf", model_hp=hp, lr=1e-2, optimizer="muon"))
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["hidden"]["muon"] and len(groups["hidden"]["params"]) == len(net.groups["hidden"])
    assert not any(g.get("muon") for name, g in groups.items() if name != "hidden")


def test_a_mup_family_refuses_muon_naming_the_field():
    with pytest.raises(ConfigError, match="train.optimizer: muon cannot replace: leave train.optimizer at adamw"):
        make_optimizer(mup_model(64), TrialConfig(model="nanogpt", lr=1e-2, optimizer="muon"))


@pytest.mark.slow
def test_a_muon_study_runs_tune_transfer_verify_and_validate(study_data_dir):
    """The tiny catalog study under Muon, every phase, validate sweeping lr under mup and standard and AdamW's beside
    it: the report says whether Muon's optimum transferred and what Muon bought over AdamW."""
    from workers.driver import run_study
    from workers.folder import StudyFolder

    data = StudySpec.from_yaml(CATALOG_DIR / "tiny.yaml").as_dict()
    data["train"]["optimizer"] = "muon"
    data["resources"]["runner"] = "local"
    data["validate"] = {"widths": [16, 32], "lrs": [0.003, 0.01, 0.03], "parametrizations": ["mup", "standard"],
                        "optimizers": ["adamw"]}
    state = run_study(StudySpec.model_validate(data), "muon-e2e")
    assert state.status == "succeeded"
    assert [p for p, s in state.phases.items() if s.done] == ["tune", "transfer", "verify", "validate"]
    validate = pd.read_csv(StudyFolder("muon-e2e").trials("validate"))
    assert set(validate.parametrization) == {"mup", "standard"} and (validate.status == "completed").all()
    assert set(validate.optimizer.fillna("muon")) == {"muon", "adamw"}
    report = (study_data_dir / "studies" / "muon-e2e" / "artifacts" / "report.md").read_text()
    assert "drifts" in report
    assert "Muon against adamw at width 32 (mup), each at its own lr carried from width 16" in report


def test_the_coordinate_check_takes_the_optimizer_from_set():
    from workers.coord_check import coord_check

    hp = {"n_layers": 1, "head_dim": 16, "max_len": 32}
    runs = {opt: coord_check(model="bert", widths=(16, 32), steps=2, seeds=2, max_seeds=2,
                             model_hp={**hp, "optimizer": opt})[0] for opt in ("adamw", "muon")}
    at = {opt: df[df.step == 1].set_index(["width", "seed", "name"]).rms for opt, df in runs.items()}
    assert (runs["adamw"][runs["adamw"].step == 0].rms.to_numpy() == runs["muon"][runs["muon"].step == 0].rms
            .to_numpy()).all()  # the same init
    assert not (at["adamw"] == at["muon"]).all()  # a different first step
    with pytest.raises(ValueError, match="muon_momentum is a knob of Muon"):
        coord_check(model="bert", widths=(16, 32), steps=2, seeds=2, max_seeds=2, model_hp={**hp, "muon_momentum": 0.9})
