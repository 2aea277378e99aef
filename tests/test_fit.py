"""The latency fit and distribution summaries (prototype/engine/fit.py) to exact values; the non-negative choice of
terms is checked by the optimality conditions of non-negative least squares."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from prototype.engine import fit

UNCACHED = np.array([0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0])
OUTPUT = np.array([10.0, 50.0, 20.0, 80.0, 30.0, 60.0, 40.0])
NOISE = np.array([0.01, -0.02, 0.0, 0.015, -0.005, 0.0, 0.004])


def ordinary_least_squares(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(coefficients, their standard errors, sum of squared residuals) by the textbook formulas."""
    coef = np.linalg.solve(X.T @ X, X.T @ y)
    sse = float(((y - X @ coef) ** 2).sum())
    cov = np.linalg.inv(X.T @ X) * sse / (len(y) - X.shape[1])
    return coef, np.sqrt(np.diag(cov)), sse


def assert_best_non_negative_fit(result, uncached, output, seconds) -> None:
    """The fit's coefficients satisfy the optimality conditions of non-negative least squares (KKT):
    the residual's gradient is zero along each positive coefficient and points up along each zero one."""
    X = np.column_stack([np.ones(len(seconds)), uncached, output])
    coef = np.array([result.fixed_s, 1 / result.prefill_tokens_per_s, 1 / result.decode_tokens_per_s])
    gradient, scale = X.T @ (X @ coef - np.asarray(seconds)), np.abs(X).sum(axis=0) * np.abs(seconds).max()
    assert (coef >= 0).all()
    assert np.all(np.where(coef > 0, np.abs(gradient) <= 1e-9 * scale, gradient >= -1e-9 * scale)), (coef, gradient)


def test_a_fit_with_every_term_positive_reports_its_errors_r2_and_residuals_exactly() -> None:
    seconds, X = 0.2 + UNCACHED / 1000 + OUTPUT / 40 + NOISE, np.column_stack([np.ones(7), UNCACHED, OUTPUT])
    coef, stderr, sse = ordinary_least_squares(X, seconds)
    result = fit.round_time_fit(list(UNCACHED), list(OUTPUT), list(seconds))
    assert (result.n, result.fixed_s, result.prefill_tokens_per_s, result.decode_tokens_per_s) == (
        7, pytest.approx(coef[0], rel=1e-9), pytest.approx(1 / coef[1], rel=1e-9), pytest.approx(1 / coef[2], rel=1e-9))
    assert result.stderr == pytest.approx(tuple(stderr), rel=1e-6)
    assert result.rmse_s == pytest.approx(math.sqrt(sse / 7), rel=1e-9)
    assert result.r2 == pytest.approx(1 - sse / float(((seconds - seconds.mean()) ** 2).sum()), rel=1e-9)
    # r2 is a ratio: the same in any unit, however small the seconds' spread.
    assert fit.round_time_fit(list(UNCACHED), list(OUTPUT), list(seconds / 100)).r2 == pytest.approx(result.r2, rel=1e-9)
    assert result.residual_quantiles == pytest.approx(tuple(np.quantile(seconds - X @ coef, (0.1, 0.5, 0.9))), abs=1e-12)
    assert float(result.predict(250.0, 30.0)) == pytest.approx(coef[0] + 250 * coef[1] + 30 * coef[2], rel=1e-9)
    assert result.predict(UNCACHED, OUTPUT) == pytest.approx(X @ coef, rel=1e-9)


def test_a_term_fitted_at_zero_has_no_standard_error_and_the_others_are_fitted_without_it() -> None:
    # The data asks for a negative rate per uncached token: the best fit drops that term, and the
    # intercept and decode rate are the least squares of the two remaining columns.
    seconds = 0.5 - UNCACHED / 4000 + OUTPUT / 40 + NOISE
    result = fit.round_time_fit(UNCACHED, OUTPUT, seconds)
    coef, stderr, sse = ordinary_least_squares(np.column_stack([np.ones(7), OUTPUT]), seconds)
    assert (result.fixed_s, result.prefill_tokens_per_s, result.decode_tokens_per_s) == (
        pytest.approx(coef[0], rel=1e-9), math.inf, pytest.approx(1 / coef[1], rel=1e-9)) and math.isnan(result.stderr[1])
    assert (result.stderr[0], result.stderr[2]) == (pytest.approx(stderr[0], rel=1e-6), pytest.approx(stderr[1], rel=1e-6))
    assert result.rmse_s == pytest.approx(math.sqrt(sse / 7), rel=1e-9)


def test_a_single_term_fit_is_chosen_when_only_it_stays_non_negative_and_the_mean_when_none_does() -> None:
    # Seconds fall with both token counts: only the intercept alone stays non-negative.
    seconds = 5.0 - UNCACHED / 200 - OUTPUT / 50 + NOISE
    result = fit.round_time_fit(UNCACHED, OUTPUT, seconds)
    assert (result.fixed_s, result.prefill_tokens_per_s, result.decode_tokens_per_s, result.r2) == (
        pytest.approx(float(seconds.mean()), rel=1e-12), math.inf, math.inf, pytest.approx(0.0, abs=1e-12))
    assert result.stderr[0] == pytest.approx(float(seconds.std(ddof=1)) / math.sqrt(7), rel=1e-9)
    assert math.isnan(result.stderr[1]) and math.isnan(result.stderr[2])
    seconds = -1.0 - UNCACHED / 1000 - OUTPUT / 100
    result = fit.round_time_fit(UNCACHED, OUTPUT, seconds)
    assert (result.fixed_s, result.prefill_tokens_per_s, result.decode_tokens_per_s, result.rmse_s) == (
        pytest.approx(float(seconds.mean()), rel=1e-12), math.inf, math.inf, pytest.approx(float(seconds.std()), rel=1e-12))
    assert all(math.isnan(s) for s in result.stderr)  # no positive term


def test_constant_seconds_have_no_r2_exactly_fitted_ones_no_error_and_four_rounds_one_degree_of_freedom() -> None:
    result = fit.round_time_fit(UNCACHED, OUTPUT, np.full(7, 1.5))
    assert result.fixed_s == pytest.approx(1.5) and math.isnan(result.r2)
    exact = fit.round_time_fit(UNCACHED[:4], OUTPUT[:4], 0.2 + UNCACHED[:4] / 1000 + OUTPUT[:4] / 40)
    assert exact.n == 4 and exact.r2 == pytest.approx(1.0, abs=1e-9)
    assert exact.stderr == pytest.approx((0.0, 0.0, 0.0), abs=1e-6)  # 4 rounds that fit exactly: no error left
    seconds = 0.2 + UNCACHED[:4] / 1000 + OUTPUT[:4] / 40 + NOISE[:4]
    coef, stderr, _ = ordinary_least_squares(np.column_stack([np.ones(4), UNCACHED[:4], OUTPUT[:4]]), seconds)  # n - 3 = 1
    assert (coef > 0).all()
    assert fit.round_time_fit(UNCACHED[:4], OUTPUT[:4], seconds).stderr == pytest.approx(tuple(stderr), rel=1e-6)


def test_the_fit_refuses_misshapen_or_non_finite_input() -> None:
    for columns in (([1, 2, 3], [1, 2, 3], [1, 2]), ([[1, 2, 3]], [[1, 2, 3]], [[1, 2, 3]])):
        with pytest.raises(ValueError, match="^uncached, output and seconds must be 1-D and of one length$"):
            fit.round_time_fit(*columns)
    # 3 rounds would give 3 coefficients exactly, residuals zero: "rmse 0.0" that says nothing.
    with pytest.raises(ValueError, match=r"needs at least 4 timed rounds \(one more than its coefficients, or it interpolates them\), got 3"):
        fit.round_time_fit([1, 2, 3], [1, 2, 4], [1, 2, 3])
    for bad in range(3):
        columns = [[1.0, 2.0, 3.0, 4.0], [4.0, 5.0, 7.0, 8.0], [1.0, 2.0, 3.0, 5.0]]
        columns[bad][1] = math.nan if bad != 1 else math.inf
        with pytest.raises(ValueError, match="^non-finite values$"):
            fit.round_time_fit(*columns)


def test_a_distribution_gives_its_count_mean_and_quantiles_and_the_tool_tail_calls_over_the_threshold() -> None:
    values = list(range(1, 102))  # 1..101: the quantiles fall on values
    assert fit.distribution(values) == {"n": 101.0, "mean": 51.0, "p10": 11.0, "p50": 51.0, "p90": 91.0, "p99": 100.0}
    empty = fit.distribution([])
    assert list(empty) == ["n", "mean", "p10", "p50", "p90", "p99"]
    assert empty["n"] == 0.0 and all(math.isnan(empty[key]) for key in ("mean", "p10", "p50", "p90", "p99"))
    assert fit.tool_tail([30, 60, 90, 120]) == (0.5, 210 / 300)  # 60 s is not over the default minute
    assert fit.tool_tail([30, 60, 90, 120], 89.0) == (0.5, 210 / 300)
    assert fit.tool_tail([30, 60, 90, 120], 90.0) == (0.25, 120 / 300)
    assert fit.tool_tail([60.0, 60.5]) == (0.5, 60.5 / 120.5)  # the default threshold is 60 s exactly
    assert fit.tool_tail([0.25, 0.5]) == (0.0, 0.0)  # short calls: no tail, but a share all the same
    for nothing in ([], [0.0, 0.0]):
        share, time_share = fit.tool_tail(nothing)
        assert math.isnan(share) and math.isnan(time_share)


def test_a_lognormal_is_the_log_moments_of_positive_values_and_a_mixture_keeps_a_sigma_floor_and_few_components() -> None:
    median, sigma = fit.lognormal([0.0, -3.0, 1.0, math.e**2, math.e**4])
    assert median == pytest.approx(math.e**2, rel=1e-12) and sigma == pytest.approx(math.sqrt(8 / 3), rel=1e-12)  # logs 0, 2, 4
    with pytest.raises(ValueError, match="^no positive values$"):
        fit.lognormal([0.0, -1.0])
    (w1, m1, s1), (w2, m2, s2) = fit.lognormal_mixture([1.0] * 10 + [math.exp(3)] * 10, 3)  # 20 values: 2 components at most
    assert (w1, w2, m1, m2, s1, s2) == (
        pytest.approx(0.5), pytest.approx(0.5), pytest.approx(1.0), pytest.approx(math.exp(3)), 0.01, 0.01)
    ((weight, median, sigma),) = fit.lognormal_mixture([2.0] * 19 + [0.0, -1.0], 3)  # 19 positive: one
    assert (weight, median, sigma) == (1.0, pytest.approx(2.0), 1e-3)
    ((weight, median, sigma),) = fit.lognormal_mixture([1.0, math.e**2] * 4, 3)
    assert (weight, median, sigma) == (1.0, pytest.approx(math.e), pytest.approx(1.0))
    with pytest.raises(ValueError, match="^no positive values$"):
        fit.lognormal_mixture([0.0], 2)
    # Three components unless asked otherwise, even where the data has four clusters.
    four = np.exp(np.repeat([0.0, 3.0, 6.0, 9.0], 10) + np.tile([-0.1, 0.1], 20))
    assert [round(math.log(median)) for _, median, _ in fit.lognormal_mixture(four, 4)] == [0, 3, 6, 9]
    assert len(fit.lognormal_mixture(four)) == 3


def test_a_mixture_separates_distant_clusters_exactly_and_keeps_a_far_outlier_as_its_own() -> None:
    low = np.exp(np.array([-0.1, 0.1] * 10))  # 20 values: log mean 0, log-sd 0.1
    high = np.exp(5 + np.array([-0.2, 0.2] * 5))  # 10 values: log mean 5, log-sd 0.2
    (w1, m1, s1), (w2, m2, s2) = fit.lognormal_mixture(np.concatenate([high, low]), 2)
    assert (w1, w2) == (pytest.approx(2 / 3, rel=1e-9), pytest.approx(1 / 3, rel=1e-9))
    assert (m1, m2) == (pytest.approx(1.0, rel=1e-9), pytest.approx(math.exp(5), rel=1e-9))
    assert (s1, s2) == (pytest.approx(0.1, rel=1e-9), pytest.approx(0.2, rel=1e-9))
    # At the start every component is ~63 of its sigmas from the outlier (log 700): its likelihoods
    # underflow unless each row is scaled by its own best before exponentiating.
    (w1, m1, s1), (w2, m2, s2) = fit.lognormal_mixture(np.concatenate([np.exp(np.tile([-0.1, 0.1], 500)), [math.exp(700)]]), 2)
    assert (w1, w2) == (pytest.approx(1000 / 1001, rel=1e-9), pytest.approx(1 / 1001, rel=1e-6))
    assert (m1, s1) == (pytest.approx(1.0, rel=1e-9), pytest.approx(0.1, rel=1e-9))
    assert (m2, s2) == (pytest.approx(math.exp(700), rel=1e-6), 0.01)


def test_a_mixture_from_overlapping_clusters_converges_to_the_em_fixed_point() -> None:
    rng = np.random.default_rng(3)
    values = np.exp(np.concatenate([rng.normal(0, 1, 200), rng.normal(2.5, 0.5, 100)]))
    (w1, m1, s1), (w2, m2, s2) = fit.lognormal_mixture(values, 2)
    assert w1 + w2 == pytest.approx(1.0) and m1 < m2
    # At the fixed point one more EM step changes nothing: each mean is its responsibility-weighted
    # mean of the logs.
    x = np.log(values)
    means, sigmas, weights = np.log([m1, m2]), np.array([s1, s2]), np.array([w1, w2])
    log_p = np.log(weights) - np.log(sigmas) - 0.5 * ((x[:, None] - means) / sigmas) ** 2
    resp = np.exp(log_p - log_p.max(axis=1, keepdims=True))
    resp /= resp.sum(axis=1, keepdims=True)
    assert (resp * x[:, None]).sum(axis=0) / resp.sum(axis=0) == pytest.approx(means, abs=1e-5)
    assert resp.sum(axis=0) / len(x) == pytest.approx(weights, abs=1e-5)


def test_a_held_out_split_fits_the_first_rounds_scores_the_last_in_percentage_errors_and_refuses_the_rest() -> None:
    assert [fit.holdout_split(n, share) for n, share in ((10, 0.3), (5, 0.3), (100, 0.25))] == [
        (range(0, 7), range(7, 10)), (range(0, 4), range(4, 5)), (range(0, 75), range(75, 100))]
    assert fit.holdout_split(10, 0.01) == (range(0, 9), range(9, 10))  # at least one held out
    # At least 4 fitted: one more than the fit's 3 coefficients, so the fit scored is no exact interpolation.
    assert fit.holdout_split(6, 0.9) == (range(0, 4), range(4, 6))
    with pytest.raises(ValueError, match=r"^a held-out score needs at least 5 timed rounds \(4 to fit, 1 to score\), got 4$"):
        fit.holdout_split(4, 0.3)
    for share in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match=rf"^the held-out share must be in \(0, 1\), got {share!r}$"):
            fit.holdout_split(10, share)
    errors = fit.percentage_errors([1.1, 2.0, 0.5, 3.0], [1.0, 2.5, 0.5, 0.0])
    assert (errors["n"], errors["zero"]) == (3, 1)
    assert (errors["median"], errors["p90"]) == (pytest.approx(10.0), pytest.approx(18.0))  # 0, 10, 20: p90 interpolates to 18
    nothing = fit.percentage_errors([1.0, 2.0], [0.0, 0.0])
    assert (nothing["n"], nothing["zero"]) == (0.0, 2.0) and math.isnan(nothing["median"]) and math.isnan(nothing["p90"])
    assert fit.percentage_errors([3.0], [2.0]) == {"n": 1.0, "zero": 0.0, "median": 50.0, "p90": 50.0}
    with pytest.raises(ValueError, match="^predicted and observed must be of one length$"):
        fit.percentage_errors([1.0], [1.0, 2.0])


def test_the_fit_and_the_summaries_raise_no_numpy_warnings() -> None:
    # `python -m prototype calibrate` prints these: an unseen term or an empty sample must not print
    # numpy's division or empty-slice warnings beside them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit.round_time_fit(np.zeros(7), OUTPUT, 0.2 + OUTPUT / 40).prefill_tokens_per_s == math.inf
        assert fit.distribution([])["n"] == 0.0 and math.isnan(fit.tool_tail([])[0])


def test_among_non_negative_subsets_the_fit_takes_the_best_even_when_residuals_are_small() -> None:
    # Rounds of tens of milliseconds whose unconstrained fit has a negative rate per uncached token:
    # two two-term subsets are non-negative, the first tried (intercept and uncached) is worse than
    # the second (intercept and output) by far less than 1 s², and the fit must be the best.
    seconds = 0.05 - UNCACHED / 50_000 + OUTPUT / 1000 + NOISE / 10
    result = fit.round_time_fit(UNCACHED, OUTPUT, seconds)
    assert result.prefill_tokens_per_s == math.inf and result.fixed_s > 0 and result.decode_tokens_per_s < math.inf
    assert_best_non_negative_fit(result, UNCACHED, OUTPUT, seconds)


@pytest.mark.parametrize("truth", [(-0.3, 1 / 2000, 1 / 50), (0.5, -1 / 5000, 1 / 50), (0.5, 1 / 2000, -1 / 400)],
                         ids=["negative intercept", "negative prefill rate", "negative decode rate"])
def test_data_whose_unconstrained_fit_is_negative_still_gets_non_negative_terms(truth):
    rng = np.random.default_rng(7)
    uncached, output = rng.integers(100, 4000, 60).astype(float), rng.integers(20, 800, 60).astype(float)
    seconds = truth[0] + truth[1] * uncached + truth[2] * output + rng.normal(0, 0.01, 60)
    unconstrained, *_ = np.linalg.lstsq(np.column_stack([np.ones(60), uncached, output]), seconds, rcond=None)
    assert (unconstrained < 0).sum() == 1  # the data really asks for a negative term
    result = fit.round_time_fit(uncached, output, seconds)
    assert [result.fixed_s, 1 / result.prefill_tokens_per_s, 1 / result.decode_tokens_per_s][int(np.argmin(unconstrained))] == 0
    assert_best_non_negative_fit(result, uncached, output, seconds)


# --- the real engine's timing fit ----------------------------------------------------------------------------------


def test_the_decode_rate_pools_every_token_after_a_calls_first() -> None:
    result = fit.engine_timing_fit([100, 200, 300, 400], [0.11, 0.16, 0.21, 0.26], [1, 11, 21, 1], [0.0, 1.0, 3.0, 0.0])
    assert result.decode_tokens_per_s == pytest.approx(30 / 4.0)  # 0 + 10 + 20 + 0 tokens over 4 s
    assert result.first_token.fixed_s == pytest.approx(0.06) and result.first_token.prefill_tokens_per_s == pytest.approx(2000)
    assert float(result.call_seconds(100, 21)) == pytest.approx(0.11 + 20 / 7.5)
    # A call of one token adds no decode time to its first token's.
    first_token = float(result.first_token.predict(100, 0.0))
    assert first_token == pytest.approx(0.11) and float(result.call_seconds(100, 1)) == float(result.call_seconds(100, 0)) == first_token
    # One token after a first, over half a second: a rate of 2 tokens/s.
    assert fit.engine_timing_fit([100, 200, 300, 400], [0.11, 0.16, 0.21, 0.26], [1, 1, 2, 1], [0.0, 0.0, 0.5, 0.0]).decode_tokens_per_s == 2.0


@pytest.mark.parametrize(("output_tokens", "decode_s"), [([1, 1, 1], [0.5, 0.0, 0.0]), ([1, 2, 5], [0.0, 0.0, 0.0])])
def test_no_decode_rate_without_both_later_tokens_and_decode_time(output_tokens, decode_s) -> None:
    with pytest.raises(ValueError, match="^a decode rate needs calls that sampled more than one token, over some time$"):
        fit.engine_timing_fit([100, 200, 300], [0.11, 0.16, 0.21], output_tokens, decode_s)
