"""The coordinate check separates μP from the standard parametrization (issue: foundation)."""

import pytest

from analysis.coord import coord_slopes, coord_verdict
from workers.coord_check import coord_data

WIDTHS = (32, 64, 128, 256)
LR = 1e-2  # one base learning rate for every case


def _slopes(parametrization: str, paradigm: str):
    df = coord_data(parametrization=parametrization, widths=WIDTHS, steps=4, lr=LR, seeds=2,
                    model_hp={"paradigm": paradigm})
    return coord_slopes(df)


@pytest.mark.parametrize("paradigm", ["channels", "rank"])
def test_mup_is_flat(paradigm):
    slopes = _slopes("mup", paradigm)
    judged = slopes[slopes.step.isin([1, 2, 3])]
    hidden = judged[judged.name != "mlm_logits"]
    assert (judged[judged.name == "mlm_logits"].slope <= 0.2).all()
    if paradigm == "channels":
        assert (hidden.slope.abs() <= 0.2).all(), hidden.sort_values("slope")
    else:  # r ∝ d: the random init part of the 1/r head logits vanishes as r^-1/2; nothing grows
        heads = hidden.name.str.startswith("head_logits")
        assert (hidden[~heads].slope.abs() <= 0.2).all(), hidden[~heads]
        assert (hidden[heads].slope <= 0.2).all()
    may_vanish = ("head_logits",) if paradigm == "rank" else ()
    assert coord_verdict(slopes, parametrization="mup", may_vanish=may_vanish).passed


@pytest.mark.parametrize("paradigm", ["channels", "rank"])
def test_standard_grows(paradigm):
    slopes = _slopes("standard", paradigm)
    step3 = slopes[(slopes.step == 3) & slopes.name.str.match(r"(z_logits|head_logits|msg_|mlm_logits)")]
    assert step3.slope.max() >= 0.4, step3.sort_values("slope")
    assert not coord_verdict(slopes, parametrization="standard").passed
