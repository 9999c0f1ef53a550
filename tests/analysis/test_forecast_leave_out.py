"""The forecast scored by leaving out every swept point: on a known power law (errors ≈ the noise, the intervals
cover), on a law that bends with width (the t-interval under-covers, the conformal one widens), the seq_len axis,
the pooled multiplier, older records and the line's words."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.forecast import (
    Forecast,
    HeldOut,
    conformal_quantile,
    forecast,
    forecast_line,
    held_out_score,
    leave_out_score,
    loo_coverage,
    min_scores,
)
from analysis.report import forecast_section
from tests.analysis._tables import trials

K = 0.05
LOG2_LRS = np.arange(-14, 0, 0.5)
N_PARAMS = {32: 1.0e4, 64: 2.5e4, 128: 7.0e4, 256: 2.0e5, 512: 6.0e5, 1024: 2.0e6}


def _power(width: float, steps: float, seq_len: float = 64) -> float:
    return -6.0 - 0.3 * math.log2(width / 32) - 0.5 * math.log2(steps / 100) - 0.4 * math.log2(seq_len / 64)


def _bent(width: float, steps: float, seq_len: float = 64) -> float:
    """The optimum falls faster the wider the model: −0.3 per doubling at width 32, −0.9 at 256."""
    x = math.log2(width / 32)
    return _power(width, steps) - 0.1 * x**2 - 0.1 * x**3 / 3


def _sweep(law=_power, widths=(32, 64, 128, 256, 512), horizons=(100, 200, 400, 800), seeds=3, noise=0.1,
           seq_lens=(None,), seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for w in widths:
        for s in horizons:
            for q in seq_lens:
                for k in range(seeds):
                    opt = law(w, s, q or 64) + rng.normal(0, noise)
                    rows += [{"width": w, "horizon": s, "seed": k, "lr": 2.0**x, "swept": "lr",
                              "eval_loss": 3.0 + K * (x - opt) ** 2, **({"seq_len": q} if q else {})}
                             for x in LOG2_LRS]
    return trials(rows, phase="validate")


def _score(table, **kw):
    return leave_out_score(table, **({"steps": 100, "batch_size": 16, "seq_len": 64, "n_params": N_PARAMS} | kw))


def test_on_a_known_law_every_point_is_scored_near_zero_and_both_intervals_cover():
    out = _score(_sweep())
    assert len(out.points) == 5 * 4 and out.skipped == []
    for h in out.points:  # its width and, with four horizons, its horizon left out: 4 widths × 3 horizons × 3 seeds
        assert h.n_fit == 4 * 3 * 3 and h.terms == ["width", "steps"] and h.se is not None
        assert h.covered == (h.interval is not None and h.interval[0] <= h.observed_log2_lr <= h.interval[1])
    assert out.errors.n == 20 and out.errors.median_log2 is not None and out.errors.median_log2 < 0.1
    assert out.errors.p90_log2 is not None and out.errors.median_log2 <= out.errors.p90_log2 < 0.25
    assert out.errors.n_nats == 20 and out.errors.p90_nats is not None and out.errors.p90_nats < K * 0.25**2
    truth = sum(h.interval is not None and h.interval[0] <= _power(h.width, h.steps) <= h.interval[1]
                for h in out.points)
    assert truth >= 18  # the t-interval is the law's mean's: it holds the true optimum near its nominal 95 %,
    assert out.t_scored == 20 and out.t_covered <= 15  # not a 3-seed mean's observed one (its noise is not in it)
    assert out.source == "leave-out" and out.scored == 20 and out.multiplier is not None
    assert out.covered is not None and out.covered >= 18  # each against the quantile of the other 19
    law = out.steplaw
    assert law is not None and law.n == 20 and law.median_log2 is not None and law.median_log2 > out.errors.p90_log2


def test_on_a_bending_law_the_t_interval_under_covers_and_the_conformal_one_is_wider():
    out = _score(_sweep(law=_bent))
    assert len(out.points) == 20 and out.errors.p90_log2 is not None and out.errors.p90_log2 > 0.5
    assert out.t_covered <= 0.6 * out.t_scored  # its nominal 95 %, far off
    t = max(abs(h.interval[1] - h.predicted_log2_lr) / h.se for h in out.points if h.interval and h.se)
    assert out.multiplier is not None and out.multiplier > 2 * t
    assert out.covered is not None and out.covered >= 17
    f = forecast(_sweep(law=_bent), target_width=1024, target_steps=800, target_batch_size=16, steps=100,
                 batch_size=16, seq_len=64)
    assert f.leave_out == out.model_copy(update={"points": [h.model_copy(update={"steplaw_log2_lr": None,
                                                                                 "steplaw_error_log2": None,
                                                                                 "steplaw_regret": None})
                                                            for h in out.points], "steplaw": None})
    assert f.interval is not None and f.conformal_interval is not None and f.se is not None
    assert f.conformal_interval == pytest.approx((f.log2_lr - out.multiplier * f.se, f.log2_lr + out.multiplier * f.se))
    assert f.conformal_interval[1] - f.conformal_interval[0] > 2 * (f.interval[1] - f.interval[0])


def test_with_too_few_points_the_interval_is_the_pooled_multiplier_else_the_largest_score_at_its_own_level():
    table = _sweep(widths=(32, 64, 128), horizons=(100, 200), seeds=2)
    out = _score(table, pooled={})
    scores = [abs(h.error_log2) / h.se for h in out.points if h.se]
    assert len(out.points) == 6 and out.scored == 6 and out.source == "max"
    assert out.multiplier == max(scores) and out.level == pytest.approx(6 / 7)
    assert out.covered == 5  # each against the largest of the other five: all but the largest
    assert out.note == "6 held-out points are too few for a 95% conformal interval (it needs 19): the largest of " \
                       "them, a 86% interval"
    pooled = _score(table, pooled={0.95: 3.0})
    assert pooled.multiplier == 3.0 and pooled.source == "pooled" and pooled.level == 0.95
    assert pooled.covered == sum(s <= 3.0 for s in scores)
    assert _score(table, pooled={0.9: 3.0}).source == "max"  # a multiplier is for its own level only


def test_two_widths_leave_no_point_to_predict():
    out = _score(_sweep(widths=(32, 128), horizons=(100, 200)))
    assert out.points == [] and len(out.skipped) == 4 and out.errors.median_log2 is None
    assert "without width 32 the fit's terms are steps, not width, steps" in out.skipped[0]


def test_a_seq_len_term_enters_only_where_the_sweeps_vary_it_and_step_law_takes_each_points_context():
    varied = _sweep(widths=(32, 64, 128), horizons=(100, 200), seq_lens=(64, 128, 256), seeds=2, noise=0.05)
    f = forecast(varied, target_width=256, target_steps=400, target_batch_size=16, steps=100, batch_size=16,
                 seq_len=512, n_params=N_PARAMS)
    assert f.terms == ["width", "steps", "seq_len"] and abs(f.coefficients["seq_len"] + 0.4) < 0.05
    assert abs(f.log2_lr - _power(256, 400, 512)) < 0.2 and f.target_seq_len == 512
    h = held_out_score(varied, steps=100, batch_size=16, seq_len=512, n_params=N_PARAMS, point=(128, 200, 16, 128))
    assert h.seq_len == 128 and h.terms == ["width", "steps", "seq_len"]
    assert h.steplaw_log2_lr == pytest.approx(math.log2(1.79 * N_PARAMS[128] ** -0.713 * (200 * 16 * 128) ** 0.307))
    assert f.leave_out is not None and len(f.leave_out.points) == 3 * 2 * 3
    assert {p.seq_len for p in f.leave_out.points} == {64, 128, 256}
    fixed = varied[varied["seq_len"] == 128]
    assert forecast(fixed, target_width=256, target_steps=400, target_batch_size=16, steps=100, batch_size=16,
                    seq_len=512).terms == ["width", "steps"]
    plain = forecast(fixed.drop(columns=["seq_len"]), target_width=256, target_steps=400, target_batch_size=16,
                     steps=100, batch_size=16, seq_len=64)
    assert plain.terms == ["width", "steps"] and "context" not in plain.note
    with pytest.raises(ValueError, match="pass the forecast's seq_len"):
        forecast(varied.assign(seq_len=varied["seq_len"].where(varied["width"] != 32)), target_width=256,
                 target_steps=400, target_batch_size=16, steps=100, batch_size=16)


def test_older_records_load_without_the_new_fields():
    f = forecast(_sweep(widths=(32, 64, 128), horizons=(100, 200), seeds=2), target_width=256, target_steps=400,
                 target_batch_size=16, steps=100, batch_size=16, seq_len=64)
    new = {"target_seq_len", "leave_out", "conformal_interval"}
    old = f.model_dump(exclude=new | {"held_out"})
    assert f.held_out is not None
    old["held_out"] = f.held_out.model_dump(exclude={"seq_len", "se", "covered"})
    loaded = Forecast.model_validate(old)
    assert loaded.leave_out is None and loaded.conformal_interval is None and loaded.target_seq_len is None
    assert isinstance(loaded.held_out, HeldOut) and loaded.held_out.se is None and loaded.held_out.covered is None
    assert "coverage not measured" in forecast_line(loaded.model_copy(update={"leave_out": None}))


def test_the_line_says_each_interval_and_the_coverage_it_achieved():
    f = forecast(_sweep(), target_width=1024, target_steps=800, target_batch_size=16, steps=100, batch_size=16,
                 seq_len=64, n_params=N_PARAMS)
    out = f.leave_out
    assert out is not None and f.interval is not None and f.conformal_interval is not None
    line = forecast_line(f)
    lo, hi = (2.0**x for x in f.conformal_interval)
    assert f"[95 % t {2.0 ** f.interval[0]:.3g}, {2.0 ** f.interval[1]:.3g}; covered {out.t_covered}/20 held-out " \
           "points]" in line
    assert f"[95 % conformal {lo:.3g}, {hi:.3g} (±{out.multiplier:.2f} se); covered {out.covered}/20 held-out " \
           "points, leave-one-out]" in line
    assert f"leave-out over 20 points: median |error| {out.errors.median_log2:.2f} log2 (p90 " in line
    assert "; Step Law " in line.split("leave-out over")[1]
    section = forecast_section(f)
    assert f"the nominal 95 % t-interval (of the law's mean) covered {out.t_covered}/20 observed optima" in section
    assert f"covered {out.covered}/20" in section and "| t-interval covered |" in section


def test_with_too_few_points_the_line_says_the_level_its_interval_has(monkeypatch):
    monkeypatch.setattr("analysis.forecast.POOLED_MULTIPLIERS", {})
    few = forecast(_sweep(widths=(32, 64, 128), horizons=(100, 200)), target_width=256, target_steps=400,
                   target_batch_size=16, steps=100, batch_size=16, seq_len=64)
    out = few.leave_out
    assert out is not None and few.conformal_interval is not None and out.t_scored == 6
    lo, hi = (2.0**x for x in few.conformal_interval)
    assert f"[86 % conformal {lo:.3g}, {hi:.3g} (±{out.multiplier:.2f} se); covered 5/6 held-out points, each " \
           "against the others' largest; 6 held-out points are too few for a 95% conformal interval (it needs " \
           "19): the largest of them, a 86% interval]" in forecast_line(few)
    two = forecast(_sweep(widths=(32, 64), horizons=(100, 200)), target_width=256, target_steps=400,
                   target_batch_size=16, steps=100, batch_size=16, seq_len=64)
    assert two.leave_out is None and "coverage not measured: fewer than three widths" in forecast_line(two)


def test_the_conformal_quantile_follows_the_finite_sample_rule():
    assert min_scores(0.95) == 19 and min_scores(0.9) == 9 and min_scores(0.5) == 1
    scores = [float(i) for i in range(1, 20)]  # 19 scores: the ⌈20 · 0.95⌉ = 19th smallest
    assert conformal_quantile(scores, 0.95) == 19.0 and conformal_quantile(scores[:-1], 0.95) is None
    assert conformal_quantile([float(i) for i in range(1, 40)], 0.95) == 38.0  # ⌈40 · 0.95⌉ = 38
    assert loo_coverage(scores, 0.95) is None  # 18 others: too few
    assert loo_coverage([*scores, 20.0], 0.95) == 19  # the largest exceeds the others' largest
    with pytest.raises(ValueError, match="level must lie in"):
        conformal_quantile(scores, 1.0)
