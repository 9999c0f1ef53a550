"""The cost account (`studies.cost`) against FLOP counts worked out by hand from the shapes."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from studies import load_catalog
from studies.cost import asha_steps, measured_cost, plan_cost, sequence_flops

# tiny spec: PT uv, n_channels 2, rank 4, T = 2 iterations, γ = 2 (K = 6 buckets), no topics, at base width 16;
# n = 32, |V| = 2000, mask rate 0.15 (4.8 decoded), batch 16. Near pairs P = 2·(31 + 30) = 122.
# width 16 (h = 2, r = 4), per iteration:
#   projections 2·2·32·16·6·2·4 = 98,304   far 2·2·2·32²·4 = 32,768   gathers 2·2·2·2·32²·4 = 65,536
#   back-projections 2·2·32·6·2·4·16 = 98,304   near 3·2·2·122·4 = 5,856   → 300,768; × 2 iterations 601,536
#   decoder 2·4.8·16·2000 = 307,200 → forward 908,736 → training 3× = 2,726,208 per sequence
# width 32 (h = 4, r = 4): 393,216 + 65,536 + 131,072 + 393,216 + 11,712 = 994,752; × 2 = 1,989,504
#   decoder 614,400 → forward 2,603,904 → training 7,811,712 per sequence
TINY_16, TINY_32 = 2_726_208, 7_811_712


def test_sequence_flops_match_the_hand_count():
    spec = load_catalog("tiny")
    assert sequence_flops(spec, 16) == pytest.approx(TINY_16, rel=1e-12)
    assert sequence_flops(spec, 32) == pytest.approx(TINY_32, rel=1e-12)


def test_asha_expectation():
    assert asha_steps(30, [10, 30], 3) == pytest.approx(10 + 20 / 3)  # one rung at 10; 30 is the budget itself
    # the GPU spec: rungs 6k, 18k, 54k below 90k
    assert asha_steps(90_000, [6000, 18_000, 54_000], 3) == pytest.approx(6000 + 12_000 / 3 + 36_000 / 9 + 36_000 / 27)
    assert asha_steps(10, [10], 3) == 10  # grace at the budget: no rung


def test_plan_of_the_tiny_spec():
    plan = plan_cost(load_catalog("tiny"))
    by = {p.phase: p for p in plan.phases}
    assert list(by) == ["tune", "transfer", "verify"]
    # tune: 6 trials × (10 + 20/3) expected steps × batch 16 at width 16; max: every trial 30 steps
    assert by["tune"].trials == 6
    assert by["tune"].flops == pytest.approx(6 * (10 + 20 / 3) * 16 * TINY_16)
    assert by["tune"].max_flops == pytest.approx(6 * 30 * 16 * TINY_16)
    # verify: 2 centre seeds + 6 samples at width 32, 30 steps each
    assert by["verify"].trials == 8 and by["verify"].flops == pytest.approx(8 * 30 * 16 * TINY_32)
    assert plan.targets == {32: pytest.approx(30 * 16 * TINY_32)}
    checks = (6 * (10 + 20 / 3) * TINY_16 + 8 * 30 * TINY_32) / (30 * TINY_32)
    assert plan.share(32) == pytest.approx(checks)
    assert plan.share(32, ("tune",)) == pytest.approx(100 * TINY_16 / (30 * TINY_32))


def test_measured_cost_counts_the_steps_that_ran():
    spec = load_catalog("tiny")
    tables = {"tune": pd.DataFrame({"width": [16, 16], "steps": [30, 10], "wall_time_s": [2.0, 1.0]}),
              "transfer": pd.DataFrame({"width": [32], "steps": [30], "wall_time_s": [4.0]}),
              "verify": pd.DataFrame({"width": [32, 32], "steps": [30, 30], "wall_time_s": [4.0, 6.0]})}
    cost = measured_cost(spec, tables, {"tune": 5.0})
    rows = {r["phase"]: r for r in cost["rows"]}
    assert rows["tune"]["flops"] == pytest.approx(40 * 16 * TINY_16)
    assert rows["tune"]["phase_wall_s"] == 5.0 and rows["verify"]["phase_wall_s"] is None
    m = cost["metrics"]
    target = 30 * 16 * TINY_32
    assert m["cost.proxy_pct.w32"] == pytest.approx(100 * 40 * 16 * TINY_16 / target)
    assert m["cost.checks_pct.w32"] == pytest.approx(100 * (40 * 16 * TINY_16 + 60 * 16 * TINY_32) / target)
    assert m["cost.proxy_wall_pct.w32"] == pytest.approx(100 * 3.0 / 4.0)
    assert m["cost.checks_wall_pct.w32"] == pytest.approx(100 * 13.0 / 4.0)
    assert all(math.isfinite(v) for v in m.values())


def test_measured_cost_without_a_flop_formula_keeps_the_wall_time():
    spec = load_catalog("tau_cpu")  # TauGPT: no FLOP formula in studies.budget
    w = spec.transfer.widths[0]
    tables = {"tune": pd.DataFrame({"width": [spec.tune.base_width], "steps": [10], "wall_time_s": [2.0]}),
              "transfer": pd.DataFrame({"width": [w], "steps": [10], "wall_time_s": [8.0]})}
    cost = measured_cost(spec, tables)
    assert cost["rows"][0]["flops"] is None
    assert cost["metrics"][f"cost.proxy_wall_pct.w{w}"] == pytest.approx(25.0)
    assert not any(k.startswith("cost.proxy_pct") for k in cost["metrics"])


def test_a_depth_sweeps_trials_cost_their_own_depth():
    """BERT with validate.depths [2, 8]: the planned and the measured validate FLOPs count each trial at its depth
    (8 blocks cost more than 2), the other phases at the arch's."""
    from studies.budget import train_flops
    from studies.families.bert import BertArch
    from studies.spec import StudySpec

    data = load_catalog("tiny").as_dict()
    data["model"] = {"family": "bert", "parametrization": "mup",
                     "arch": {"n_layers": 2, "depth_parametrization": "completep", "head_dim": 8}}
    data["space"] = None
    data["validate"] = {"widths": [16], "lrs": [0.001, 0.01, 0.1], "depths": [2, 8]}
    spec = StudySpec.model_validate(data)
    deep = sequence_flops(spec, 16, 8)
    assert deep > sequence_flops(spec, 16, 2) == sequence_flops(spec, 16)
    assert deep == pytest.approx(train_flops("bert", BertArch(n_layers=8, head_dim=8), 16, spec.data.vocab_size,
                                             spec.data.seq_len, spec.data.mask_rate, 1, 16))
    steps, batch = spec.steps_for("validate"), spec.train.batch_size
    [validate] = [p for p in plan_cost(spec).phases if p.phase == "validate"]
    assert validate.trials == 2 * 2 * 3
    assert validate.flops == pytest.approx(2 * 3 * steps * batch * (sequence_flops(spec, 16, 2) + deep))
    table = pd.DataFrame({"width": [16, 16, 16], "depth": [2.0, 8.0, None], "steps": [10, 10, 10],
                          "wall_time_s": [1.0, 1.0, 1.0]})
    [row] = measured_cost(spec, {"validate": table})["rows"]
    assert row["flops"] == pytest.approx(10 * batch * (2 * sequence_flops(spec, 16) + deep))
