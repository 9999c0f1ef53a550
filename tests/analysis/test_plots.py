"""Every plot function writes a non-empty PNG, diverged runs included."""

import numpy as np
import pandas as pd
import pytest

from analysis.coord import plot_coord
from analysis.plots import plot_mutransfer, plot_transfer, plot_tune_history, plot_verify
from tests.analysis._tables import HPARAMS, coord_table, mup_like, paper_like_optimum, sweep_table, trials

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


@pytest.fixture
def verify_rows():
    centre = dict.fromkeys(HPARAMS, 1.0)
    rows = [{"is_centre": True, "seed": s, "eval_loss": 2.0 + s / 100} for s in range(3)]
    rows += [{"lr": 1 + i / 100, "w_H": 1 - i / 200, "eval_loss": 2.05 + i / 500} for i in range(20)]
    rows += [{"lr": 1.4, "status": "diverged"}]
    return trials(rows, phase="verify"), centre


def test_plot_verify(tmp_path, verify_rows):
    table, centre = verify_rows
    plot_verify(table, centre, HPARAMS, tmp_path / "verify.png")
    assert_png(tmp_path / "verify.png")


def test_plot_verify_shows_the_tolerance_line(tmp_path, verify_rows):
    """A sample counts as better only below centre − tolerance: the line is drawn and kept in view."""
    table, centre = verify_rows
    centre_loss = float(table.loc[table["is_centre"].eq(True), "eval_loss"].mean())
    tolerance = 0.2  # the line at 1.81, below every loss (2.0–2.09)
    [limits, _] = plot_verify(table, centre, HPARAMS, tmp_path / "verify.png", tolerance=tolerance)
    assert limits is not None and limits[0] < centre_loss - tolerance < float(table["eval_loss"].min())
    assert_png(tmp_path / "verify.png")


def test_plot_transfer(tmp_path):
    table = trials(
        [
            {"width": w, "seed": s, "eval_loss": 3.0 - 0.1 * i + 0.01 * s, "params": 10**6 * 2**i}
            for i, w in enumerate([64, 128, 256])
            for s in range(2)
        ]
        + [{"width": 512, "status": "diverged", "params": 8 * 10**6}],
        phase="transfer",
    )
    plot_transfer(table, tmp_path / "sub" / "transfer.png")
    assert_png(tmp_path / "sub" / "transfer.png")


def test_plot_tune_history(tmp_path):
    statuses = ["completed", "stopped", "diverged", "completed", "failed", "completed"]
    losses = [3.0, 3.5, None, 2.8, None, 2.9]
    table = trials([{"status": s, "eval_loss": v} for s, v in zip(statuses, losses, strict=True)])
    plot_tune_history(table, tmp_path / "tune.png")
    assert_png(tmp_path / "tune.png")


def test_plot_mutransfer(tmp_path):
    table = sweep_table(paper_like_optimum)
    table.loc[table["lr"] >= 2.0**-5, "status"] = "diverged"
    plot_mutransfer(table, tmp_path / "mutransfer.png")
    assert_png(tmp_path / "mutransfer.png")


@pytest.mark.parametrize("with_param", [True, False])
def test_plot_coord(tmp_path, with_param):
    table = pd.concat(
        [
            coord_table(mup_like(), steps=(1, 2)),
            coord_table(mup_like(hidden=0.5, param="standard"), steps=(1, 2)),
        ]
    )
    if not with_param:
        table = table[table["parametrization"] == "mup"].drop(columns="parametrization")
    plot_coord(table, tmp_path / "coord.png")
    assert_png(tmp_path / "coord.png")


def test_a_blown_up_point_does_not_set_the_loss_scale(tmp_path):
    table = sweep_table(paper_like_optimum)
    table.loc[(table["parametrization"] == "mup") & (table["lr"] == 2.0**-4) & (table["width"] == 512),
              "eval_loss"] = 100.0
    limits = plot_mutransfer(table, tmp_path / "mutransfer.png")
    assert_png(tmp_path / "mutransfer.png")
    assert len(limits) == 2 and limits[0] == limits[1]  # shared axes
    low, high = limits[0]
    sane = table.loc[table["eval_loss"] < 100, "eval_loss"]
    assert sane.max() < high < 6.0 and low < sane.min()  # every sane point shown, the 100 off the scale


def test_loss_limits_keep_a_tight_spread_and_drop_outliers():
    from analysis._figures import loss_limits

    low, high = loss_limits([5.0, 5.1, 5.2, 5.3, 97.0, float("inf"), float("nan")])
    assert 4.9 < low < 5.0 and 5.3 < high < 5.4
    assert loss_limits([float("inf")]) is None
    assert loss_limits([5.0]) == pytest.approx((4.95, 5.05))


def test_plot_transfer_includes_the_base_width_and_its_scale(tmp_path):
    tune = trials([{"width": 32, "eval_loss": 3.5, "status": "completed"},
                   {"width": 32, "eval_loss": 3.2, "status": "stopped"}])
    transfer = trials([{"width": w, "eval_loss": 3.3 - 0.1 * i} for i, w in enumerate([64, 128])], phase="transfer")
    [limits] = plot_transfer(pd.concat([tune, transfer]), tmp_path / "transfer.png")
    assert_png(tmp_path / "transfer.png")
    assert limits[0] < 3.2 and 3.5 < limits[1] < 3.6  # the base width's best completed trial (3.5) is in view


def test_the_horizon_figure_has_a_panel_per_width_and_parametrization(tmp_path):
    from analysis.plots import plot_sweep
    from studies.sweeps import SWEEPS
    from tests.analysis.test_transfer import _horizon_table

    table = pd.concat([_horizon_table(lambda s, seed: -8.0), _horizon_table(lambda s, seed: -9.0, width=128)])
    table.loc[(table["lr"] == 2.0**-4) & (table["horizon"] == 600), "status"] = "diverged"
    table.loc[(table["lr"] == 2.0**-14), "eval_loss"] = 50.0  # blown up: off the clipped axis
    limits = plot_sweep(table, tmp_path / "horizon.png", SWEEPS["horizon"].axis, "{} steps")
    assert (tmp_path / "horizon.png").stat().st_size > 10_000
    assert len(limits) == 2 and limits[0] is not None and limits[0][1] < 50.0  # one row per width, mup only


def test_the_depth_figure_has_a_panel_per_depth_parametrization(tmp_path):
    from analysis.plots import plot_sweep
    from studies.sweeps import SWEEPS
    from tests.analysis.test_transfer import _depth_table, depth_sweep

    table = _depth_table(lambda dp, depth, seed: -8.0 - (0.8 * np.log2(depth / 2) if dp == "none" else 0.0))
    table.loc[(table["lr"] == 2.0**-4) & (table["depth"] == 8), "status"] = "diverged"
    table.loc[(table["lr"] == 2.0**-14), "eval_loss"] = 50.0  # blown up: off the clipped axis
    limits = plot_sweep(depth_sweep(table), tmp_path / "depth.png", SWEEPS["depth"].axis, "depth {}")
    assert (tmp_path / "depth.png").stat().st_size > 10_000
    assert len(limits) == 2 and limits[0] is not None and limits[0][1] < 50.0  # completep and none, clipped
    with pytest.raises(ValueError, match="no sweep along the depth"):
        plot_sweep(table.iloc[0:0], tmp_path / "none.png", SWEEPS["depth"].axis, "depth {}")
