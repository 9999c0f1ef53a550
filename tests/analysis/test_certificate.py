"""The local-optimality certificate: the binomial arithmetic against known answers, and `certify`."""

import math

import pandas as pd
import pytest
from scipy.stats import beta, binomtest

from analysis.certificate import certify, confidence, min_samples, upper_bound
from tests.analysis._tables import trials, verify_table

# --- the arithmetic ---------------------------------------------------------------------------


def test_min_samples_is_59_for_the_papers_p_and_alpha():
    assert min_samples(0.05, 0.05) == 59
    assert min_samples() == 59
    assert confidence(59, 0.05) >= 0.95
    assert confidence(58, 0.05) < 0.95
    assert round(confidence(59, 0.05), 4) == 0.9515


def test_min_samples_does_not_round_past_an_integer_ratio():
    # ln(0.9801)/ln(0.99) evaluates to 2.000000000000001: a naive ceil gives 3.
    assert math.log(0.9801) / math.log(0.99) > 2
    assert min_samples(0.01, 0.9801) == 2


@pytest.mark.parametrize(("p", "alpha"), [(0.05, 0.05), (0.01, 0.05), (0.1, 0.01), (0.2, 0.1), (0.05, 0.001)])
def test_min_samples_is_the_smallest_n_reaching_the_confidence(p, alpha):
    n = min_samples(p, alpha)
    assert confidence(n, p) >= 1 - alpha
    assert confidence(n - 1, p) < 1 - alpha


def test_min_samples_rejects_probabilities_outside_0_1():
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        min_samples(0.0, 0.05)


def test_62_samples_none_better_gives_the_papers_numbers():
    assert round(upper_bound(0, 62, 0.05), 4) == 0.0472
    assert round(confidence(62, 0.05), 3) == 0.958


def test_upper_bound_is_one_sided_not_the_two_sided_default():
    two_sided = binomtest(0, 62).proportion_ci(confidence_level=0.95).high
    assert round(two_sided, 4) == 0.0578
    assert upper_bound(0, 62, 0.05) < 0.05 < two_sided


@pytest.mark.parametrize(("k", "n"), [(1, 62), (2, 62), (3, 62), (10, 62), (4, 30), (17, 20)])
def test_upper_bound_matches_the_beta_quantile(k, n):
    # Clopper-Pearson's one-sided upper limit is the (1-α) quantile of Beta(k+1, n-k).
    assert upper_bound(k, n, 0.05) == pytest.approx(beta.ppf(0.95, k + 1, n - k), abs=1e-9)


def test_upper_bound_k_of_62_matches_the_tabulated_values():
    assert [round(upper_bound(k, 62), 4) for k in (1, 2, 3)] == [0.0742, 0.0981, 0.1203]


def test_upper_bound_by_hand():
    # k=0: P(X=0) = (1-u)^n = α  →  u = 1 - α^(1/n).
    assert upper_bound(0, 10, 0.1) == pytest.approx(1 - 0.1 ** (1 / 10), abs=1e-12)
    # k=n-1: P(X<=n-1) = 1 - u^n = α  →  u = (1-α)^(1/n); for n=2, α=0.05: √0.95.
    assert upper_bound(1, 2, 0.05) == pytest.approx(math.sqrt(0.95), abs=1e-12)
    assert upper_bound(3, 4, 0.2) == pytest.approx(0.8 ** (1 / 4), abs=1e-12)
    # k=n: every sample better, nothing can be excluded.
    assert upper_bound(5, 5, 0.05) == 1.0


def test_upper_bound_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= k <= n"):
        upper_bound(3, 2)


# --- certify --------------------------------------------------------------------------------


def test_62_samples_none_better_is_certified():
    cert = certify(verify_table([2.0, 2.02, 1.98], [2.1 + i / 1000 for i in range(62)]))
    assert (cert.n_samples, cert.n_better, cert.centre_rank) == (62, 0, 1)
    assert round(cert.upper_bound, 4) == 0.0472
    assert round(cert.confidence_if_none_better, 3) == 0.958
    assert cert.certified
    assert cert.verdict.startswith("centre is in the top 5% of its neighbourhood with confidence 95%")
    assert "0 of 62 samples beat it by more than 0.02" in cert.verdict


def test_58_samples_cannot_certify_59_can():
    assert not certify(verify_table([2.0], [2.1] * 58)).certified
    assert certify(verify_table([2.0], [2.1] * 59)).certified


def test_seed_spread_tolerance_is_the_centre_seed_std():
    cert = certify(verify_table([2.0, 2.02, 1.98], [2.1] * 10))
    assert cert.tolerance_source == "seed_spread"
    assert cert.centre_loss == pytest.approx(2.0)
    assert cert.centre_seed_std == pytest.approx(0.02)
    assert cert.tolerance == pytest.approx(0.02)
    assert cert.centre_seeds == 3


def test_seed_spread_with_one_centre_seed_is_zero():
    cert = certify(verify_table([2.0], [2.1] * 10))
    assert cert.tolerance == 0.0
    assert cert.centre_seed_std == 0.0


def test_relative_tolerance_is_scaled_by_the_centre_loss():
    cert = certify(verify_table([2.0, 2.02, 1.98], [2.1] * 10), tolerance=0.004)
    assert cert.tolerance_source == "relative"
    assert cert.tolerance == pytest.approx(0.008)


def test_tolerance_decides_whether_a_close_sample_beats_the_centre():
    table = verify_table([2.0, 2.02, 1.98], [1.99] + [2.1] * 61)
    wide = certify(table)  # margin 0.02: 1.99 is within the seed noise
    assert wide.n_better == 0 and wide.certified
    narrow = certify(table, tolerance=0.004)  # margin 0.008: 1.99 < 1.992 beats it
    assert narrow.n_better == 1 and not narrow.certified
    assert narrow.upper_bound == pytest.approx(beta.ppf(0.95, 2, 61))
    assert narrow.verdict.startswith("centre is NOT certified in the top 5%")
    assert "1 of 62 samples beat it" in narrow.verdict
    # the rank ignores the tolerance: 1.99 is below the centre either way
    assert wide.centre_rank == narrow.centre_rank == 2


def test_best_sample_and_its_relative_improvement():
    cert = certify(verify_table([2.0], [1.99, 2.1, 2.2]))
    assert cert.best_sample_loss == pytest.approx(1.99)
    assert cert.best_relative_improvement == pytest.approx(0.005)
    worse = certify(verify_table([2.0], [2.1, 2.2]))
    assert worse.best_relative_improvement == pytest.approx(-0.05)


def test_diverged_samples_count_as_worse_and_are_reported():
    cert = certify(verify_table([2.0], ["diverged", "diverged", 2.1, 1.9]))
    assert cert.n_samples == 4
    assert cert.n_diverged == 2
    assert cert.n_better == 1
    assert cert.centre_rank == 2
    assert cert.best_sample_loss == pytest.approx(1.9)
    assert "2 diverged, counted as worse" in cert.verdict


def test_a_nan_loss_counts_as_diverged():
    cert = certify(verify_table([2.0], [math.nan, 2.1]))
    assert cert.n_diverged == 1


def test_all_samples_diverged_leaves_no_best_sample():
    cert = certify(verify_table([2.0], ["diverged"] * 3))
    assert cert.best_sample_loss is None and cert.best_relative_improvement is None
    assert cert.n_better == 0


def test_failed_samples_are_left_out_of_n():
    cert = certify(verify_table([2.0], ["failed", 2.1, 2.2]))
    assert (cert.n_samples, cert.n_failed) == (2, 1)


def test_ties_count_in_the_centres_favour():
    cert = certify(verify_table([2.0], [2.0, 2.0, 1.5, 2.5]))
    assert cert.centre_rank == 2


def test_other_phases_are_ignored():
    table = pd.concat([verify_table([2.0], [2.1] * 5), trials([{"eval_loss": 0.5}] * 3, phase="tune")])
    cert = certify(table)
    assert cert.n_samples == 5 and cert.n_better == 0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (verify_table([], [2.1, 2.2]), "is_centre=True"),
        (verify_table([2.0], []), "run the verify phase's N samples"),
        (verify_table([2.0], ["failed"]), "run the verify phase's N samples"),
        (trials([{"eval_loss": 2.0}]), "phase='verify'"),
    ],
)
def test_missing_centre_or_samples_name_the_fix(table, message):
    with pytest.raises(ValueError, match=message):
        certify(table)


def test_a_diverged_centre_cannot_be_certified():
    table = verify_table([2.0], [2.1])
    table.loc[0, "status"] = "diverged"
    with pytest.raises(ValueError, match="centre run\\(s\\) diverged"):
        certify(table)


def test_unknown_tolerance_names_the_choices():
    with pytest.raises(ValueError, match="'seed_spread' or a relative float"):
        certify(verify_table([2.0], [2.1]), tolerance="noise")


def test_certificate_round_trips_through_json():
    cert = certify(verify_table([2.0, 2.1], ["diverged", 2.2]))
    assert type(cert).model_validate_json(cert.model_dump_json()) == cert


def test_a_concatenated_table_with_repeated_index_labels():
    table = pd.concat([verify_table([2.0], [2.1] * 30), verify_table([], [1.5] + [2.1] * 31)])
    assert table.index.duplicated().any()
    cert = certify(table)
    assert (cert.n_samples, cert.n_better, cert.centre_rank) == (62, 1, 2)


def test_neighbour_advice_names_the_directions_of_the_better_samples():
    from analysis.neighbours import neighbour_advice

    rows = [{"is_centre": True, "seed": s, "eval_loss": 5.0 + s / 100} for s in range(3)]
    # better samples: larger lr, mixed w_H; worse samples: smaller lr
    rows += [{"lr": 1.3, "w_H": 0.8 + 0.4 * (i % 2), "eval_loss": 4.8} for i in range(4)]
    rows += [{"lr": 0.7, "w_H": 1.1, "eval_loss": 5.3} for _ in range(6)]
    table = trials(rows, phase="verify")
    centre = {"lr": 1.0, "w_H": 1.0}
    advice = neighbour_advice(table, centre, ["lr", "w_H"], tolerance=0.01)
    assert advice.n_better == 4 and advice.n_samples == 10
    assert [d.hparam for d in advice.directions] == ["lr"]
    assert advice.directions[0].median_change == pytest.approx(0.3)
    assert "larger lr" in advice.text and "tune.num_trials" in advice.text and "train.steps" in advice.text


def test_neighbour_advice_without_better_samples():
    from analysis.neighbours import neighbour_advice

    advice = neighbour_advice(verify_table([5.0, 5.01], [5.2] * 5), {"lr": 1.0}, ["lr"], tolerance=0.01)
    assert advice.n_better == 0 and advice.directions == [] and "full N" in advice.text
