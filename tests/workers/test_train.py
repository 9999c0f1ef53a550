import copy
import math
import subprocess
import sys

import pytest
import torch

from studies.spec import DataSpec
from workers.train import EagerAdamW, TrialConfig, lr_factor, train_trial

DATA = DataSpec(max_tokens=150_000, seq_len=32)
HP = {"width": 32, "base_width": 32, "n_channels": 2, "rank": 8, "n_iter": 2, "gamma": 2, "parametrization": "mup"}


def _cfg(**kw):
    base = dict(model_hp=HP, data=DATA, steps=20, batch_size=16, eval_every=10, eval_batches=2)
    return TrialConfig(**{**base, **kw})


def test_absurd_lr_diverges_without_raising():
    result = train_trial(_cfg(lr=1e6, grad_clip=0.0, warmup_steps=1, steps=30))
    assert result.status == "diverged"
    assert math.isnan(result.eval_loss)
    assert "step" in result.message


def test_reproducible_on_cpu():
    a, b = train_trial(_cfg(seed=3)), train_trial(_cfg(seed=3))
    c = train_trial(_cfg(seed=4))
    assert a.eval_loss == b.eval_loss
    assert a.eval_loss != c.eval_loss


def test_progress_reports_lr_per_group_and_eval():
    rows = []
    result = train_trial(_cfg(log_every=5), progress=rows.append)
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    assert {"lr_input", "lr_hidden", "lr_output", "lr_bias"} <= set(rows[-1])
    # μP: hidden lr = base lr / width_mult (1 here), so the groups agree at width_mult 1
    assert rows[-1]["lr_hidden"] == pytest.approx(rows[-1]["lr_input"])
    assert "eval_loss" in rows[1] and "eval_loss" not in rows[0]
    assert result.tokens > 0 and result.tokens_per_s > 0
    # the trial process's own use, psutil-free: MLflow shows `system/` metrics under its System metrics tab
    assert 0 < rows[-1]["system/cpu_utilization_percentage"] <= 100 * torch.get_num_threads() * 1.5
    assert 50 < rows[-1]["system/peak_rss_megabytes"] < 64_000


def test_mup_group_lrs_follow_width_mult():
    rows = []
    train_trial(_cfg(model_hp={**HP, "width": 64}, steps=5, eval_every=5, log_every=5), progress=rows.append)
    assert rows[-1]["lr_hidden"] == pytest.approx(rows[-1]["lr_input"] / 2)
    assert rows[-1]["lr_output"] == pytest.approx(rows[-1]["lr_input"] / 2)


def test_schedule_warmup_then_decay():
    cfg = _cfg(steps=100, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(99, cfg) == pytest.approx(0.1, abs=0.01)
    assert lr_factor(50, _cfg(steps=100, schedule="constant")) == 1.0


def test_a_trial_dict_with_an_unknown_key_is_rejected():
    with pytest.raises(ValueError, match=r"stepz\n  Extra inputs are not permitted"):
        train_trial({"stepz": 3})


def test_100_steps_on_builtin_corpus_lower_eval_loss_by_over_a_nat():
    # width 32, 16 × 32 tokens a step: ≈ 2.4 nats off in 100 steps (width 64, 32 × 64, 200 steps: 1.9; 8× the time)
    cfg = TrialConfig(model_hp=HP, data=DATA, steps=100, batch_size=16, eval_every=50, lr=1e-2, warmup_steps=10)
    rows = []
    result = train_trial(cfg, progress=rows.append)
    first = rows[0]["train_loss"]
    assert result.status == "completed"
    # the untrained model is near ln|V|; 100 steps must take off more than a nat
    assert result.eval_loss < first - 1.0, (first, result.eval_loss)


CLM = DataSpec(max_tokens=150_000, seq_len=32, objective="clm", stream_val_every=4)
TAU = {"width": 32, "base_width": 16, "head_dim": 8, "n_layers": 1, "max_len": 32, "parametrization": "mup"}


def _tau(**kw):
    return _cfg(**{"model": "tauformer", "model_hp": TAU, "data": CLM, "lr": 3e-3, "steps": 40, **kw})


def test_taugpt_trains_next_tokens_with_calibrated_tau_monitoring_and_stream_validation():
    rows = []
    result = train_trial(_tau(), progress=rows.append)
    assert result.status == "completed"
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.5  # it learns next tokens
    first = evals[0]
    assert first["tau.tau"] > 0 and 0 < first["tau.entropy.layer0"] < 1
    assert first["tau.E_k.p05.layer0"] <= first["tau.E_k.p50.layer0"] <= first["tau.E_k.p95.layer0"]
    assert first["tau.collapse.layer0"] in (0.0, 1.0)
    assert all(r["tau.tau"] == first["tau.tau"] for r in evals)  # calibrated once, at step 0
    assert all(math.isfinite(r["stream_val_loss"]) for r in evals)  # every 4th batch was held back
    assert result.tokens == 40 * 16 * 32  # diverted batches are not trained on, nor counted


def test_the_model_objective_must_match_the_data():
    with pytest.raises(ValueError, match="set data.objective to 'clm'"):
        train_trial(_tau(data=DATA))
    with pytest.raises(ValueError, match="set data.objective to 'mlm'"):
        train_trial(_cfg(data=CLM))


def test_plateau_halves_the_lr_after_patience_evals_without_a_new_best():
    rows = []
    train_trial(_cfg(lr=1e-12, warmup_steps=1, schedule="constant", eval_every=5, log_every=5,
                     plateau_patience=1), progress=rows.append)
    # eval losses never improve (lr ≈ 0 leaves the weights unchanged): the scale halves after every eval but
    # the first, taking effect from the next step
    assert [r["lr_scale"] for r in rows] == [1.0, 1.0, 0.5, 0.25]
    assert rows[-1]["lr_input"] == pytest.approx(1e-12 * 0.25, rel=1e-9, abs=0)


def test_taugpt_trains_from_a_streamed_jsonl_corpus(tmp_path, monkeypatch):
    import json

    from workers.data import shakespeare_texts

    lines = [line for text in shakespeare_texts()[:2] for line in text.splitlines() if line.strip()]
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path / "home"))  # after reading the shared download
    corpus = tmp_path / "train.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": [f"id-{i}", line]}) for i, line in enumerate(lines)))
    data = DataSpec(source="jsonl", path=str(corpus), streaming=True, objective="clm", seq_len=32,
                      vocab_size=2000, stream_val_every=5, max_eval_sequences=16)
    result = train_trial(_tau(data=data, steps=20, eval_every=10))
    assert result.status == "completed" and result.eval_loss < math.log(2000)
    assert {"stream_val_loss", "tau.tau", "tau.entropy.layer0"} <= set(result.rows[-1])


def _resumed(cfg, at: int):
    """Train `cfg`, keep the state saved (through torch.save) at evaluation step `at`, and resume from it."""
    import io

    import torch

    saved = {}

    def keep(row, state):
        if row["step"] == at:
            buf = io.BytesIO()
            torch.save(state, buf)
            saved["state"] = buf.getvalue()

    full = train_trial(cfg, checkpoint=keep)
    state = torch.load(io.BytesIO(saved["state"]), weights_only=True)
    rows = []
    return full, train_trial(cfg, progress=rows.append, resume=state), rows


@pytest.mark.parametrize("kw", [{}, {"plateau_patience": 1, "data": DataSpec(max_tokens=150_000, seq_len=32,
                                                                                  stream_val_every=4)}])
def test_a_resumed_trial_ends_exactly_where_an_undisturbed_one_ends(kw):
    cfg = _cfg(steps=30, eval_every=10, log_every=5, **kw)
    full, resumed, rows = _resumed(cfg, at=10)
    assert [r["step"] for r in rows] == [15, 20, 25, 30]  # only the steps after the checkpoint
    assert resumed.eval_loss == full.eval_loss and resumed.best_eval_loss == full.best_eval_loss
    assert resumed.tokens == full.tokens and resumed.steps == full.steps == 30
    drop = ("tokens_per_s", "system/cpu_utilization_percentage", "system/peak_rss_megabytes")
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed.rows] == \
        [{k: v for k, v in r.items() if k not in drop} for r in full.rows]


def test_an_eval_loss_worse_than_uniform_prediction_is_diverged():
    """Above max(ln|V|, the untrained loss) + uniform_margin the run is recorded diverged (with why), not completed
    or stopped; a run that merely has not learned yet (lr ≈ 0) is not."""
    blown = train_trial(_cfg(steps=10, eval_every=10, uniform_margin=-100.0))
    assert blown.status == "diverged" and math.isnan(blown.eval_loss)
    assert "worse than uniform prediction" in blown.message and "step 10" in blown.message
    assert train_trial(_cfg(steps=10, eval_every=10, uniform_margin=None)).status == "completed"
    idle = train_trial(_cfg(steps=10, eval_every=10, lr=1e-12, uniform_margin=0.3))
    assert idle.status == "completed"


def test_a_fresh_process_trains_without_importing_torch_dynamo():
    """torch.optim's wrappers import torch._dynamo on their first call, 0.9 s of every fresh trial process (a phase's
    trial actors, `ptctl train`), only to mark the optimiser's methods uncompilable: a trial never compiles them."""
    cfg = _cfg(steps=2, eval_every=2, batch_size=2, eval_batches=1).model_dump_json()
    code = ("import sys; from workers.train import TrialConfig, train_trial; "
            f"r = train_trial(TrialConfig.model_validate_json({cfg!r})); "
            "print(r.status, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["completed", "False"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_optimiser_is_torchs_adamw_to_the_bit(dtype):
    """`EagerAdamW` is `torch.optim.AdamW` less the dynamo import: the same parameters after every step, and each
    loads the other's state dict (checkpoints written before it resume)."""
    def groups(model):
        return [{"params": [model[0].weight], "lr": 3e-2, "weight_decay": 0.1},
                {"params": [model[0].bias, model[1].weight], "lr": 1e-2, "weight_decay": 0.0, "eps": 1e-6}]

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3, bias=False)).to(dtype)
    b = copy.deepcopy(a)
    ref, ours = torch.optim.AdamW(groups(a), betas=(0.9, 0.95)), EagerAdamW(groups(b), betas=(0.9, 0.95))
    x = torch.randn(16, 8, dtype=dtype)
    for step in range(6):
        for model, opt in ((a, ref), (b, ours)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True)), step
    assert str(ours.state_dict()) == str(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
