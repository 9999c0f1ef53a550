"""A model built with mup as a family (`studies.family.from_mup`, `workers.models.mup_model`): the example plugin
(`examples/nanogpt_mup`, installed by `make install`) trains with mup's own shapes and optimiser, reports its
infshapes, passes the coordinate check under μP and fails it under the standard parametrization; a plugin whose
readout is a plain `nn.Linear`, whose `set_base_shapes` was skipped or whose hidden layer is initialised with a
width-independent std fails `ptctl coord-check` naming the parameter and the fix.

The misuse cases are throwaway distributions (`tests.studies.test_plugins`' way): each subclasses the example's
model with one mistake, and `ptctl coord-check` runs in a fresh interpreter that discovers it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mup
import pytest
import torch

from studies.family import family_names, get_family
from studies.spec import DataSpec, TrialConfig
from tests.studies.test_plugins import _distribution
from workers.models import build_model
from workers.train import make_optimizer, train_trial

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "nanogpt_mup"
WIDTHS = "32,64,128,256"

def test_the_example_plugin_is_installed():
    """The module's other tests need the example, which `make install` installs."""
    assert "nanogpt" in family_names(), "install the example plugin: pip install -e examples/nanogpt_mup"


def _model(width: int, parametrization: str = "mup"):
    torch.manual_seed(0)
    return build_model("nanogpt", vocab_size=50, width=width, base_width=32, parametrization=parametrization,
                       n_layers=1, n_heads=4, max_len=16)


def test_mup_sets_the_shapes_and_the_learning_rates_are_mups_own():
    net = _model(128)
    shapes = net.infshapes()
    assert shapes["blocks.0.attn.proj.weight"] == "128 (base 32) × 128 (base 32)"
    assert shapes["readout.weight"] == "50 × 128 (base 32)"
    cfg = TrialConfig(model="nanogpt", lr=1e-2, weight_decay=0.1)
    opt = make_optimizer(net, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    reference = mup.MuAdamW(net.net.parameters(), lr=1e-2, weight_decay=0.1)  # what mup gives the same model
    undecayed = {id(p) for p in net.net.parameters() if p.dim() < 2}  # its biases and LayerNorm gains
    expect = {id(p): (g["lr"], 0.0 if id(p) in undecayed else g["weight_decay"]) for g in reference.param_groups
              for p in g["params"]}
    assert {id(p): (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]} == expect
    assert {g["name"]: g["lr"] for g in opt.param_groups} == {"matrix": 1e-2 / 4, "vector": 1e-2, "bias": 1e-2}
    # the standard parametrization is mup's: every width multiplier 1, so every lr the base lr
    assert {g["lr"] for g in make_optimizer(_model(128, "standard"), cfg).param_groups} == {1e-2}


def test_a_trial_reports_its_infshapes_and_mups_group_multipliers():
    cfg = TrialConfig(model="nanogpt", lr=3e-3, steps=4, eval_every=2, log_every=2, batch_size=4, eval_batches=1,
                      data=DataSpec(objective="clm", seq_len=16, max_tokens=20_000, vocab_size=500),
                      model_hp={"width": 64, "base_width": 32, "parametrization": "mup", "n_layers": 1,
                                "n_heads": 4, "max_len": 16})
    result = train_trial(cfg)
    assert result.status == "completed", result.message
    assert result.lr_multipliers == {"matrix": 0.5, "vector": 1.0, "bias": 1.0}
    assert result.run_params["infshape.blocks.0.mlp.0.weight"] == "256 (base 128) × 64 (base 32)"
    assert set(result.run_params) == {f"infshape.{n}" for n, _ in _model(64).net.named_parameters()}
    assert {"lr_matrix", "lr_vector"} <= set(result.rows[-1])


def test_a_mup_family_trains_each_trial_alone():
    from studies import load_catalog
    from studies.cost import planned_trials
    from studies.members import batches

    spec = load_catalog("nanogpt_mup")
    trials = planned_trials(spec)["verify"]
    assert get_family("nanogpt").mup is not None
    assert {len(b) for b in batches(spec, trials, 16)} == {1}


# ----------------------------------------------------------------------------- the coordinate check, from the CLI
def _coord_check(site: Path | None, *args: str) -> subprocess.CompletedProcess:
    path = [str(site)] if site else []
    env = {**{k: v for k, v in os.environ.items() if k != "PTCTL_FAMILIES"},
           "PYTHONPATH": os.pathsep.join([*path, str(EXAMPLE), str(REPO)]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "service.cli", "coord-check", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_the_example_passes_under_mup_and_its_logits_blow_up_under_standard(parametrization, tmp_path):
    done = _coord_check(None, "--model", "nanogpt", "--widths", WIDTHS, "--parametrization", parametrization,
                        "--out", str(tmp_path))
    out = " ".join((done.stdout + done.stderr).split())
    if parametrization == "mup":
        assert done.returncode == 0, out
        assert "coordinate check passes" in out
        assert "blocks.0.attn.qkv.weight │ 768 (base 96) × 256 (base 32)" in out  # the infshape table
    else:
        assert done.returncode == 1, out
        assert "coordinate check fails" in out and "worst logits" in out, out


def _bad_plugin(tmp_path: Path, name: str, source: str) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, f"{name}-plugin", f"{name}_plugin", source, {name: f"{name}_plugin:FAMILY"})
    return site


PLAIN_READOUT = """
    from torch import nn

    from nanogpt_mup import GPTArch, GPTSpace
    from nanogpt_mup.model import make_model as example
    from studies.family import from_mup


    def make_model(width, vocab_size, **kw):
        net = example(width, vocab_size, **kw)
        net.readout = nn.Linear(width, vocab_size, bias=False)  # the mistake: not mup.MuReadout
        return net


    FAMILY = from_mup("plainreadout", "plainreadout_plugin:make_model", GPTArch, GPTSpace,
                      coord_hp={"n_layers": 1, "n_heads": 4, "max_len": 32})
"""

FIXED_STD = """
    from torch import nn

    from nanogpt_mup import GPTArch, GPTSpace
    from nanogpt_mup.model import GPT
    from studies.family import from_mup


    class Fixed(GPT):
        def mup_init(self):
            super().mup_init()
            nn.init.normal_(self.blocks[0].mlp[0].weight, std=0.02)  # the mistake: nanoGPT's std at every width


    def make_model(width, vocab_size, **kw):
        return Fixed(width, vocab_size, **kw)


    FAMILY = from_mup("fixedstd", "fixedstd_plugin:make_model", GPTArch, GPTSpace,
                      coord_hp={"n_layers": 1, "n_heads": 4, "max_len": 32})
"""

NO_SHAPES = """
    import dataclasses

    from nanogpt_mup import GPTArch, GPTSpace
    from nanogpt_mup.model import make_model
    from studies.family import from_mup
    from workers.models.contract import LanguageModel
    from workers.models.mup_model import SIZE_FIELDS


    class Unshaped(LanguageModel):  # a hand-written family around the mup model: set_base_shapes forgotten
        def __init__(self, cfg):
            super().__init__()
            kw = {k: v for k, v in cfg.model_dump().items() if k not in SIZE_FIELDS}
            self.net = make_model(cfg.width, cfg.vocab_size, **kw)
            self.groups = {"all": list(self.net.parameters())}

        def lr_multipliers(self):
            return {"all": 1.0}

        def forward(self, input_ids, attention_mask=None, trace=None, select=None):
            logits = self.net(input_ids)
            return logits if select is None else logits[select]


    FAMILY = dataclasses.replace(from_mup("noshapes", "nanogpt_mup.model:make_model", GPTArch, GPTSpace,
                                          coord_hp={"n_layers": 1, "n_heads": 4, "max_len": 32}),
                                 model=Unshaped, mup=None)
"""


@pytest.mark.slow  # `ptctl coord-check` in a fresh interpreter, as the families' coordinate checks
@pytest.mark.parametrize(("name", "source", "expected"), [
    ("plainreadout", PLAIN_READOUT, ["readout has infinite fan-in and finite fan-out", "mup.MuReadout"]),
    ("fixedstd", FIXED_STD, ["parameter 'blocks.0.mlp.0.weight': its std·√fan_in at initialisation scales as "
                             "width^+0.5", "σ/√fan_in"]),
    ("noshapes", NO_SHAPES, ["parameter 'tokens.weight' has no infshape", "mup.set_base_shapes was never called",
                             "studies.family.from_mup"]),
])
def test_a_misparametrized_plugin_fails_the_coordinate_check_naming_the_parameter_and_the_fix(
        name, source, expected, tmp_path):
    done = _coord_check(_bad_plugin(tmp_path, name, source), "--model", name, "--widths", WIDTHS,
                        "--out", str(tmp_path / "out"))
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, out
    assert "Traceback" not in out
    for text in expected:
        assert text in out, out
    assert not (tmp_path / "out").exists()  # it failed before training: nothing written


@pytest.mark.slow
def test_fixing_the_init_clears_the_finding(tmp_path):
    """The same plugin as `fixedstd` with the std scaled 1/√fan_in is not flagged (the check is not blind)."""
    fixed = FIXED_STD.replace("std=0.02)", "std=0.02 * (64 / self.blocks[0].mlp[0].weight.shape[1]) ** 0.5)")
    site = _bad_plugin(tmp_path, "fixedstd", fixed)
    script = textwrap.dedent(f"""
        from workers.coord_check import built
        from workers.models.mup_model import mup_problems
        print("PROBLEMS", mup_problems(built("fixedstd", "mup", ({WIDTHS},))))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(EXAMPLE), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "PROBLEMS []" in done.stdout, done.stdout


def test_a_study_records_each_trials_infshapes_and_mups_learning_rates(tmp_path, monkeypatch):
    """Through the driver (in process): every trial run carries mup's groups (`lr_mult.*`) and each parameter's
    infshape (`infshape.*`) as params, and the study ends as any other."""
    from studies import StudySpec, load_catalog
    from tests.workers.test_batched_study import Recorder, _data_dir
    from workers.driver import run_study
    from workers.runner import InProcessRunner

    _data_dir(tmp_path / "data", monkeypatch)
    data = load_catalog("tiny_tau").as_dict()
    data["model"] = {"family": "nanogpt", "parametrization": "mup", "arch": {"n_layers": 1, "n_heads": 2,
                                                                            "max_len": 32}}
    data["tune"]["num_trials"] = 2
    data["verify"]["n_samples"] = 2
    data["train"].update(steps=10, eval_every=5, log_every=5, warmup_steps=2)  # what is recorded, not learning
    data["verify"]["steps"], data["tune"]["asha"]["grace_steps"] = 10, 5
    data.pop("space")
    tracker = Recorder()
    state = run_study(StudySpec.model_validate(data), "nanogpt-tiny", runner=InProcessRunner(), tracker=tracker)
    assert state.status == "succeeded", state
    names = {n for n, _ in build_model("nanogpt", vocab_size=50, width=32, base_width=16, parametrization="mup",
                                       n_layers=1, n_heads=2, max_len=32).net.named_parameters()}
    runs = {r["key"]: r["params"] for r in tracker.trials.values()
            if r["key"] != "verify-centre-s0"}  # the transfer run reused: recorded, not trained again
    assert {key.split("-")[0] for key in runs} == {"tune", "transfer", "verify"}, sorted(runs)
    for key, params in runs.items():
        assert {k.removeprefix("infshape.") for k in params if k.startswith("infshape.")} == names, key
        width = 16 if key.startswith("tune") else 32
        assert params["infshape.blocks.0.attn.proj.weight"] == f"{width} (base 16) × {width} (base 16)", key
        assert float(params["lr_mult.matrix"]) == 16 / width and float(params["lr_mult.vector"]) == 1.0, key
