"""The local-optimality certificate: the binomial arithmetic against known answers, and `certify`."""

import math

import pandas as pd
import pytest
from scipy.stats import beta, binom, binomtest, norm

from analysis.certificate import (
    Certificate,
    certify,
    confidence,
    min_samples,
    noise_better_rate,
    noise_explains,
    noise_sd,
    upper_bound,
)
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
    with pytest.raises(ValueError, match="'seed_spread', 'seed_noise' or a relative float"):
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


# --- the seed-noise model -------------------------------------------------------------------------

Q3 = norm.cdf(-math.sqrt(3 / 4))  # t = s at 3 centre seeds: Φ(-1/√(1+1/3))


def test_noise_rate_at_the_seed_spread_and_three_seeds_is_19_percent():
    assert round(Q3, 4) == 0.1932
    # one seed's sample against a 3-seed mean: sd s·√(4/3); t = s is 0.866 of it, whatever s
    for s in (0.02, 0.033, 1.0):
        assert noise_sd(s, 3) == pytest.approx(s * math.sqrt(4 / 3))
        assert noise_better_rate(s, s, 3) == pytest.approx(Q3, abs=1e-12)
    assert noise_better_rate(0.05, 0.02, 5) == pytest.approx(norm.cdf(-0.05 / (0.02 * math.sqrt(1.2))), abs=1e-12)
    assert noise_better_rate(0.0, 0.02, 3) == pytest.approx(0.5)


def test_noise_rate_is_unknown_with_one_seed_or_no_spread():
    assert noise_better_rate(0.01, 0.0, 3) is None
    assert noise_better_rate(0.01, 0.02, 1) is None
    assert noise_explains(5, 59, None) is None


def test_noise_explains_up_to_the_binomial_quantile():
    cut = binom.ppf(0.95, 59, Q3)
    assert cut == 17  # E = 11.4 of 59; P(X <= 17) >= 0.95 > P(X <= 16)
    assert noise_explains(17, 59, Q3) and not noise_explains(18, 59, Q3)
    assert noise_explains(13, 59, Q3, alpha=0.5) is False  # the median, 11, is the cut at α = 0.5
    # a lead beyond Φ⁻¹(1-α/N) = 3.14 noise sds at N = 59 is not noise, however few beat the centre
    assert noise_explains(1, 59, Q3, lead=3.1) and not noise_explains(1, 59, Q3, lead=3.2)


def _flat(n_better: int, n: int = 59, better: float = 1.97, lrs: tuple[float, ...] = (1.3, 0.7)) -> pd.DataFrame:
    """Centre seeds 2.0 ± 0.02 (s = 0.02); n_better samples at `better`, the rest at 2.01; lr alternates."""
    rows = [{"is_centre": True, "seed": s, "eval_loss": loss} for s, loss in enumerate((2.0, 2.02, 1.98))]
    rows += [{"lr": lrs[i % len(lrs)], "eval_loss": better if i < n_better else 2.01} for i in range(n)]
    return trials(rows, phase="verify")


def test_certificate_carries_the_noise_expectation():
    cert = certify(_flat(15))  # the CPU study's count: 15 of 59 at t = s, 3 seeds
    assert (cert.n_better, cert.n_samples, cert.centre_seeds) == (15, 59, 3)
    assert cert.noise_better_rate == pytest.approx(Q3, abs=1e-12)
    assert cert.noise_better_expected == pytest.approx(59 * Q3, abs=1e-9)
    assert round(cert.noise_better_expected, 2) == 11.40
    assert cert.noise_explains is True and not cert.certified
    assert "seed noise alone would make ≈11.4 of 59 equally good samples beat it" in cert.verdict


def test_many_samples_far_ahead_are_not_noise():
    assert certify(_flat(25, better=1.8)).noise_explains is False  # too many
    few_far = certify(_flat(2, better=1.8))  # 2 of 59, but 0.2 ahead = 8.7 noise sds
    assert few_far.noise_better_expected == pytest.approx(59 * Q3) and few_far.noise_explains is False


def test_noise_fields_are_none_with_one_centre_seed():
    cert = certify(verify_table([2.0], [1.9] + [2.1] * 58), tolerance=0.004)
    assert cert.noise_better_rate is None and cert.noise_better_expected is None and cert.noise_explains is None
    assert not cert.certified and "seed noise" not in cert.verdict


def test_seed_noise_tolerance_is_twice_the_sd_of_a_one_seed_difference():
    cert = certify(verify_table([2.0, 2.02, 1.98], [2.1] * 10), tolerance="seed_noise")
    assert cert.tolerance_source == "seed_noise"
    assert cert.tolerance == pytest.approx(2 * 0.02 * math.sqrt(4 / 3))
    assert cert.noise_better_rate == pytest.approx(norm.cdf(-2.0))  # ≈ 2.3%


def test_a_certificate_written_before_the_noise_fields_still_loads():
    old = certify(verify_table([2.0, 2.1], [2.2] * 3)).model_dump(exclude={"noise_better_rate",
                                                                           "noise_better_expected", "noise_explains"})
    assert Certificate.model_validate(old).noise_explains is None


def test_advice_names_seed_noise_when_it_explains_the_count():
    from analysis.neighbours import ADVICE, neighbour_advice

    table = _flat(15)
    cert = certify(table)
    advice = neighbour_advice(table, {"lr": 1.0}, ["lr"], cert.tolerance, alpha=cert.alpha)
    assert advice.n_better == 15
    text = advice.text
    assert text.startswith("15 of 59 samples beat the centre, but ≈11.4 of 59 would beat an equally good centre by "
                           "seed noise alone at this tolerance (t = 0.02 = 0.87·σ, σ = 0.02309, the sd of")
    assert "not evidence of a better neighbourhood" in text
    assert "verify.centre_seeds" in text and "verify.tolerance" in text and "seed_noise" in text
    assert "≥ 2·σ = 0.04619" in text and "relative margin ≥ 0.023" in text
    assert ADVICE not in text and "tune.num_trials" not in text


@pytest.mark.parametrize(("n_better", "noise"), [(17, True), (18, False)])
def test_advice_blames_noise_up_to_the_binomial_quantile_only(n_better, noise):
    from analysis.neighbours import ADVICE, neighbour_advice

    text = neighbour_advice(_flat(n_better, lrs=(1.3,)), {"lr": 1.0}, ["lr"], 0.02).text
    assert ("not evidence of a better neighbourhood" in text) is noise
    assert (ADVICE in text) is not noise


def test_advice_keeps_the_directions_when_noise_cannot_explain_them():
    from analysis.neighbours import ADVICE, neighbour_advice

    # 25 of 59 far ahead, all with a larger lr; the rest behind with a smaller one
    rows = [{"is_centre": True, "seed": s, "eval_loss": loss} for s, loss in enumerate((2.0, 2.02, 1.98))]
    rows += [{"lr": 1.3, "eval_loss": 1.8}] * 25 + [{"lr": 0.7, "eval_loss": 2.1}] * 34
    table = trials(rows, phase="verify")
    cert = certify(table)
    assert cert.noise_explains is False
    advice = neighbour_advice(table, {"lr": 1.0}, ["lr"], cert.tolerance)
    assert [d.hparam for d in advice.directions] == ["lr"]
    assert advice.text == ("the 25 of 59 samples that beat the centre mostly have larger lr (median +30%, 25 of 25); "
                           "seed noise alone would make ≈11.4 of 59 equally good samples beat it. "
                           f"What to do: {ADVICE}.")


def test_advice_when_the_tolerance_is_already_above_the_noise():
    from analysis.neighbours import neighbour_advice

    table = _flat(2, better=1.93)  # 0.07 ahead: beyond 2σ = 0.046, within the 3.14σ a best of 59 reaches by noise
    cert = certify(table, tolerance="seed_noise")
    assert (cert.n_better, cert.noise_explains) == (2, True) and not cert.certified
    text = neighbour_advice(table, {"lr": 1.0}, ["lr"], cert.tolerance).text
    assert "≈1.3 of 59 would beat an equally good centre" in text and "t = 0.04619 = 2.00·σ" in text
    assert "raise verify.n_samples" in text and "noise rate, here 2.3%" in text


def test_advice_says_the_noise_is_unknown_with_one_centre_seed():
    from analysis.neighbours import ADVICE, neighbour_advice

    table = verify_table([2.0], [1.9] + [2.1] * 58)
    text = neighbour_advice(table, {"lr": 1.0}, ["lr"], 0.008).text
    assert "the seed noise is unknown" in text and "verify.centre_seeds" in text and ADVICE in text


def test_the_best_samples_lead_over_the_centre_in_nats_and_percent():
    """The paper's "best perturbed sample ≤ 0.4 % better than the centre": centre mean 2.005, best sample 1.997."""
    cert = certify(verify_table([2.0, 2.01], [1.997, 2.2, 2.3]))
    assert cert.best_lead == pytest.approx(0.008) and cert.best_lead_pct == pytest.approx(100 * 0.008 / 2.005)
    assert "the best sample is 0.008 nats (0.4 %) better than the centre" in cert.verdict
    # 3 samples are too few to certify: the bound is compared with p, then the lead follows
    assert not cert.certified and f"fraction {cert.upper_bound:.4f} > 0.05; the best sample is" in cert.verdict
    ahead = certify(verify_table([2.0, 2.01], [2.105, 2.2]))  # the centre leads the best sample by 0.1
    assert ahead.best_lead == pytest.approx(-0.1) and ahead.best_lead_pct == pytest.approx(-100 * 0.1 / 2.005)
    assert "the centre beats every sample, the best by 0.1 nats (5 %)" in ahead.verdict
    diverged = certify(verify_table([2.0, 2.01], ["diverged"] * 3))
    assert diverged.best_lead is None and "better than the centre" not in diverged.verdict
