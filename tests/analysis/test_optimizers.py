"""One optimizer against another, each at its own lr carried from the narrowest width (`analysis.optimizers`), on
synthetic sweeps whose loss is an exact parabola in log2(lr) and whose eval curves are straight lines in tokens: the
carried lrs, the paired difference and the speed-up are known in closed form."""

import json
import math

import numpy as np
import pytest

from analysis.optimizers import gain_line, optimizer_gain, tokens_to
from tests.analysis._tables import trials

LRS = [2.0**k for k in range(-10, -3)]
OPTIMA = {"muon": -6.0, "adamw": -8.0}  # log2 lr*, the same at both widths
FLOOR = {"muon": 4.0, "adamw": 4.1}
TOKENS = 10_000


def _loss(opt, log2_lr, seed):
    return FLOOR[opt] + 0.05 * (log2_lr - OPTIMA[opt]) ** 2 + 0.01 * seed


def _curve(final):
    """From 8 nats to `final` in a straight line over TOKENS, evaluated every 2,000 tokens."""
    return [[t, 8.0 + (final - 8.0) * t / TOKENS] for t in range(2000, TOKENS + 1, 2000)]


def _rows(**change):
    rows = []
    for opt in OPTIMA:
        for width in (32, 128):
            for lr in LRS:
                for seed in (0, 1, 2):
                    loss = _loss(opt, math.log2(lr), seed)
                    rows.append({"optimizer": opt, "width": width, "lr": lr, "seed": seed, "eval_loss": loss,
                                 "eval_curve": json.dumps(_curve(loss))})
    table = trials(rows, phase="validate", tokens=TOKENS)
    for (opt, seed), status in change.get("status", {}).items():
        table.loc[(table.optimizer == opt) & (table.width == 128) & (table.seed == seed) &
                  np.isclose(table.lr, 2.0 ** OPTIMA[opt]), ["status", "eval_loss"]] = [status, math.nan]
    return table


def test_tokens_to_interpolates_between_evaluations():
    curve = [[100, 5.0], [200, 4.0], [300, 3.0]]
    assert tokens_to(curve, 4.5) == pytest.approx(150) and tokens_to(curve, 3.0) == 300
    assert tokens_to(curve, 6.0) == 100 and tokens_to(curve, 2.9) is None and tokens_to([], 1.0) is None


def test_each_optimizer_carries_its_own_optimum_and_the_gain_is_paired_by_seed():
    g = optimizer_gain(_rows(), "muon", "adamw")
    assert (g.proxy, g.target) == (32, 128)
    assert math.log2(g.proxy_lr["muon"]) == pytest.approx(-6) and math.log2(g.proxy_lr["adamw"]) == pytest.approx(-8)
    assert g.lr == {"muon": 2.0**-6, "adamw": 2.0**-8}
    assert g.loss["muon"].mean == pytest.approx(4.01) and g.loss["adamw"].mean == pytest.approx(4.11)
    assert g.difference.mean == pytest.approx(-0.1) and g.difference.ci == pytest.approx((-0.1, -0.1))
    # muon's seed s falls to 4.11 (adamw's mean) at (8 − 4.11) / (8 − 4.0 − 0.01 s) of the tokens
    speedups = [(8 - 4.0 - 0.01 * s) / (8 - 4.11) for s in (0, 1, 2)]
    assert g.reached == pytest.approx([TOKENS / x for x in speedups]) and g.tokens == TOKENS
    assert g.speedup.mean == pytest.approx(np.mean(speedups)) and g.speedup.n == 3
    line = gain_line(g)
    assert line.startswith("Muon against adamw at width 128 (mup), each at its own lr carried from width 32 "
                           "(muon 0.0156, adamw 0.00391): eval loss 4.0100 [")
    assert "muon − adamw -0.1000 [-0.1000, -0.1000] nats paired by seed" in line
    assert f"reaches adamw's final loss in {g.speedup.mean:.2f}× [" in line
    assert "×] fewer tokens (3 of 3 seeds reach it)" in line


def test_the_worse_optimizer_never_reaches_and_a_diverged_run_is_counted_not_averaged():
    g = optimizer_gain(_rows(), "adamw", "muon")
    assert g.reached == [None, None, None] and g.speedup.mean is None and g.difference.mean == pytest.approx(0.1)
    assert "adamw did not reach muon's final loss within its 10,000 tokens" in gain_line(g)
    g = optimizer_gain(_rows(status={("muon", 1): "diverged"}), "muon", "adamw")
    assert g.n_diverged == {"muon": 1, "adamw": 0} and g.loss["muon"].n == 2 and g.reached[1] is None
    assert g.difference.n == 2 and "1 muon run(s) diverged at the carried lr" in gain_line(g)


def test_an_optimizer_without_rows_at_both_widths_is_named():
    rows = _rows()
    with pytest.raises(ValueError, match="optimizer 'adamw' has no lr sweep at widths 32 and 128"):
        optimizer_gain(rows[~((rows.optimizer == "adamw") & (rows.width == 128))], "muon", "adamw")
    with pytest.raises(ValueError, match="one parametrization's rows"):
        optimizer_gain(rows.assign(parametrization=["mup", "standard"] * (len(rows) // 2)), "muon", "adamw")
