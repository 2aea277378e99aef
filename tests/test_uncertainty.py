"""Figures with their uncertainty (prototype/uncertainty.py): intervals that cover what they should, n carried
with every figure, and orderings and rankings claimed only where the intervals separate."""

import math

import attrs
import numpy as np
import pytest
from scipy import stats

from prototype import uncertainty as u


def parts(estimate):
    return tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in attrs.astuple(estimate))


def total_less(a, b):
    return a.sum() - b.sum()


def test_a_bootstrap_interval_holds_the_statistic_counts_its_samples_is_seeded_and_needs_two_distinct_samples():
    samples = [1.0, 2.0, 2.5, 3.0, 4.0, 4.5, 5.0, 7.0, 8.0, 9.5]
    estimate = u.bootstrap(samples, np.median)
    assert (estimate.value, estimate.n, estimate.of) == (4.25, 10, "tasks")
    assert estimate.low < 4.25 < estimate.high
    assert min(samples) <= estimate.low and estimate.high <= max(samples)
    # The same every run; its ends move little with the seed.
    samples = np.random.default_rng(3).lognormal(0.0, 0.5, 40)
    assert u.bootstrap(samples) == u.bootstrap(samples)
    other = u.bootstrap(samples, seed=1)
    base = u.bootstrap(samples)
    width = base.high - base.low
    assert abs(other.low - base.low) < 0.1 * width and abs(other.high - base.high) < 0.1 * width
    # Too few samples have no interval (equal samples, an exact one; no samples, no value: the parametrized cases below).
    one = u.bootstrap([3.0])
    assert (one.value, one.n, one.has_interval, one.format("{:.1f}")) == (3.0, 1, False, "3.0")


@pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning", "ignore::RuntimeWarning")
@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_an_interval_is_scipys_bca_at_its_confidence_and_the_percentile_interval_where_bca_is_undefined(confidence):
    def scipy_interval(sample, method):
        return stats.bootstrap((np.array(sample),), np.median, n_resamples=u.RESAMPLES, confidence_level=confidence,
                               method=method, rng=np.random.default_rng(u.SEED)).confidence_interval

    spread = [1.0, 2.0, 2.5, 3.0, 4.0, 4.5, 5.0, 7.0, 8.0, 9.5]
    assert attrs.astuple(u.bootstrap(spread, np.median, confidence=confidence))[1:3] == tuple(scipy_interval(spread, "BCa"))
    # Every jackknife median of this sample is 1, so BCa's acceleration is 0/0 and scipy's ends are NaN.
    ties = [1.0] * 10 + [2.0, 3.0, 4.0, 5.0]
    assert all(math.isnan(end) for end in scipy_interval(ties, "BCa"))
    assert attrs.astuple(u.bootstrap(ties, np.median, confidence=confidence))[1:3] == tuple(scipy_interval(ties, "percentile"))


def test_the_mean_interval_covers_the_true_mean_about_95_times_in_100():
    rng = np.random.default_rng(7)
    covered = sum((e := u.bootstrap(rng.normal(10.0, 2.0, 30))).low <= 10.0 <= e.high for _ in range(100))
    # Binomial(100, 0.95) lies in [88, 100] with probability > 0.999; a broken interval (a point, or the sample's
    # range) falls outside.
    assert 88 <= covered <= 100
    narrow = u.bootstrap(rng.normal(10.0, 2.0, 30))
    assert narrow.high - narrow.low < 2.5


def test_a_paired_ratio_resamples_tasks_together_and_an_unpaired_difference_each_sample_on_its_own():
    http = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    chained = http / 2  # twice as fast on every task: every paired resample gives exactly 2
    ratio = u.paired_bootstrap(http, chained, lambda a, b: a.sum() / b.sum())
    assert (ratio.low, ratio.value, ratio.high) == (2.0, 2.0, 2.0)
    noisy = chained * np.random.default_rng(0).uniform(0.9, 1.1, 6)
    unpaired_spread = u.bootstrap(http).high / u.bootstrap(noisy).low  # what ignoring the pairing would allow
    paired = u.paired_bootstrap(http, noisy, lambda a, b: a.sum() / b.sum())
    assert paired.low < paired.value < paired.high < unpaired_spread
    with pytest.raises(ValueError, match=r"\b2\b.*\b1\b"):  # names both lengths
        u.paired_bootstrap([1.0, 2.0], [1.0], lambda a, b: 0.0)
    # An unpaired difference resamples each sample on its own.
    run = [3.0, 3.2, 2.9, 3.4, 3.1, 2.8, 3.3, 3.0]
    floor = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0]
    difference = u.unpaired_bootstrap(run, floor, lambda a, b: np.mean(a) - np.mean(b), of="turns")
    assert difference.value == pytest.approx(np.mean(run) - np.mean(floor)) and difference.n == 8 and difference.of == "turns"
    assert difference.method == "bootstrap" and difference == u.unpaired_bootstrap(run, floor, lambda a, b: np.mean(a) - np.mean(b), of="turns")
    assert difference.low < difference.value < difference.high
    # Wider than the first sample's own interval shifted by the second's mean: the second's spread counts too.
    alone = u.bootstrap(np.asarray(run) - np.mean(floor), np.mean)
    assert difference.high - difference.low > alone.high - alone.low
    constant = u.unpaired_bootstrap([3.0] * 4, [2.0] * 3, lambda a, b: np.mean(a) - np.mean(b), of="turns")
    assert attrs.astuple(constant) == (1.0, 1.0, 1.0, 4, "turns", "exact")
    # One constant sample: the interval is the other's spread alone (3 less the mean of three draws of 1, 2, 3).
    spread = u.unpaired_bootstrap([3.0] * 4, [1.0, 2.0, 3.0], lambda a, b: np.mean(a) - np.mean(b))
    assert attrs.astuple(spread) == (1.0, 0.0, 2.0, 4, "tasks", "bootstrap")
    # Two tasks, chained a second under http on each: every paired resample (two draws of a pair) differs by 2,
    # while resampling each sample on its own draws totals of 2..6 less totals of 0..4.
    http, chained = [1.0, 3.0], [0.0, 2.0]
    assert attrs.astuple(u.paired_bootstrap(http, chained, total_less)) == (2.0, 2.0, 2.0, 2, "tasks", "paired bootstrap")
    assert attrs.astuple(u.unpaired_bootstrap(http, chained, total_less)) == (2.0, -2.0, 6.0, 2, "tasks", "bootstrap")
    # Numbers read back as text (a CSV's cells) are numbers.
    for resampled in (u.paired_bootstrap, u.unpaired_bootstrap):
        assert resampled(["1.5", "2", "4"], ["1", "1", "2"], total_less) == resampled([1.5, 2.0, 4.0], [1.0, 1.0, 2.0], total_less)


@pytest.mark.parametrize("estimate, expected", [
    (lambda: u.resample(0, u.unit_mean([]), method="paired bootstrap"), ("nan", "nan", "nan", 0, "tasks", "paired bootstrap")),
    (lambda: u.resample(2, u.unit_total([1.0, 3.0])), (4.0, 2.0, 6.0, 2, "tasks", "bootstrap")),
    (lambda: u.resample(2, u.unit_total([1.0, 3.0]), of="seeds", method="paired bootstrap"), (4.0, 2.0, 6.0, 2, "seeds", "paired bootstrap")),
    (lambda: u.resample(3, u.unit_total([2.0, 2.0, 2.0]), of="seeds"), (6.0, 6.0, 6.0, 3, "seeds", "exact")),
    (lambda: u.resample(1, u.unit_mean([3.0]), of="seeds", method="paired bootstrap"), (3.0, "nan", "nan", 1, "seeds", "paired bootstrap")),
    (lambda: u.resample(3, u.unit_total([1.0, 2.0, 4.0]), interval=False), (7.0, "nan", "nan", 3, "tasks", "bootstrap")),
    (lambda: u.bootstrap([]), ("nan", "nan", "nan", 0, "tasks", "bootstrap")),
    (lambda: u.bootstrap([5.0], of="seeds"), (5.0, "nan", "nan", 1, "seeds", "bootstrap")),
    (lambda: u.bootstrap([2.0, 2.0, 2.0]), (2.0, 2.0, 2.0, 3, "tasks", "exact")),
    (lambda: u.bootstrap([1.0, 3.0], np.sum), (4.0, 2.0, 6.0, 2, "tasks", "bootstrap")),  # two samples: sums 2, 4, 6
    (lambda: u.bootstrap(["1", "3"], np.sum), (4.0, 2.0, 6.0, 2, "tasks", "bootstrap")),  # text read back as numbers
    (lambda: u.paired_bootstrap([3.0] * 3, [1.0] * 3, total_less, of="seeds"), (6.0, 6.0, 6.0, 3, "seeds", "exact")),
    # One constant sample beside one that varies: the pairs still vary (9 less the totals of three draws of 1, 2, 3).
    (lambda: u.paired_bootstrap([3.0] * 3, [1.0, 2.0, 3.0], total_less), (3.0, 0.0, 6.0, 3, "tasks", "paired bootstrap")),
    (lambda: u.paired_bootstrap([], [], total_less), ("nan", "nan", "nan", 0, "tasks", "paired bootstrap")),
    (lambda: u.paired_bootstrap([3.0], [1.0], total_less), (2.0, "nan", "nan", 1, "tasks", "paired bootstrap")),
    (lambda: u.unpaired_bootstrap([1.0, 2.0, 4.0], [], total_less), ("nan", "nan", "nan", 3, "tasks", "bootstrap")),
    (lambda: u.unpaired_bootstrap([], [1.0, 2.0], total_less), ("nan", "nan", "nan", 0, "tasks", "bootstrap")),
    (lambda: u.unpaired_bootstrap([5.0], [1.0, 2.0], total_less), (2.0, "nan", "nan", 1, "tasks", "bootstrap")),
    (lambda: u.unpaired_bootstrap([1.0, 2.0, 4.0], [2.0], total_less), (5.0, "nan", "nan", 3, "tasks", "bootstrap")),
    (lambda: u.rate(0, 0), ("nan", "nan", "nan", 0, "trials", "exact binomial")),
    (lambda: u.events_per(3, 0.0), ("nan", "nan", "nan", 3, "events", "exact Poisson")),
    (lambda: u.from_half_width(0.5, 0.25, 20), (0.5, 0.25, 0.75, 20, "trajectories", "SALib")),
    (lambda: u.from_half_width(4.0, 1.0, 8, of="seeds", method="Sobol"), (4.0, 3.0, 5.0, 8, "seeds", "Sobol")),
])
def test_a_figure_without_samples_or_exposure_has_no_value_one_sample_no_interval_and_each_carries_n_and_what_it_counts(estimate, expected):
    assert parts(estimate()) == expected


def test_a_rate_has_the_exact_binomial_interval_and_events_per_exposure_the_exact_poisson_one():
    assert attrs.astuple(u.rate(1, 1)) == (1.0, pytest.approx(0.025), 1.0, 1, "trials", "exact binomial")  # one trial is enough
    estimate = u.rate(2, 40)
    exact = stats.binomtest(2, 40).proportion_ci(method="exact")
    assert (estimate.value, estimate.n, estimate.low, estimate.high) == (0.05, 40, exact.low, exact.high)
    assert u.rate(0, 10).low == 0.0 and u.rate(10, 10).high == 1.0
    narrower = stats.binomtest(2, 40).proportion_ci(confidence_level=0.9)
    assert attrs.astuple(u.rate(2, 40, of="tasks", confidence=0.9)) == (0.05, narrower.low, narrower.high, 40, "tasks", "exact binomial")
    # Two events in four tasks: 0.5 a task, and the Garwood interval for 2 events is [0.242, 7.225] events.
    estimate = u.events_per(2, 4.0)
    assert estimate.value == 0.5 and estimate.n == 2 and estimate.of == "events"
    assert (estimate.low, estimate.high) == pytest.approx((0.2422 / 4, 7.2247 / 4), rel=1e-3)
    assert (u.events_per(0, 10.0).low, u.events_per(0, 10.0).high) == (0.0, pytest.approx(3.6889 / 10, rel=1e-3))
    # Garwood's ends are chi-square quantiles; half an hour's exposure doubles the rate and its ends.
    garwood = (stats.chi2.ppf(0.025, 6) / 2, stats.chi2.ppf(0.975, 8) / 2)
    half_hour, hour = u.events_per(3, 0.5), u.events_per(3, 1.0, of="reconnects")
    assert (half_hour.value, half_hour.low, half_hour.high) == pytest.approx((6.0, 2 * garwood[0], 2 * garwood[1]), rel=1e-12)
    assert (hour.value, hour.low, hour.high) == pytest.approx((3.0, *garwood), rel=1e-12)
    assert (half_hour.n, half_hour.of, hour.of, hour.method) == (3, "events", "reconnects", "exact Poisson")


def test_an_ordering_or_ranking_is_claimed_only_where_intervals_separate():
    a, b, c = u.Estimate(1.0, 0.9, 1.1, 10), u.Estimate(2.0, 1.8, 2.2, 10), u.Estimate(2.1, 1.9, 2.3, 10)
    assert (u.order({"b": b, "a": a, "c": c}), u.order({"b": b, "a": a, "c": c}, ascending=False)) == ("a < b ~ c", "c ~ b > a")
    assert u.order({"z": a, "y": b}) == "z < y" and u.order({}) == ""  # by value, not by name
    touching = u.Estimate(1.8, 1.6, 1.8, 10)  # ends that meet overlap
    assert not u.separated(touching, b) and not u.separated(b, touching)
    assert (u.holds(a, b), u.holds(b, a), u.holds(b, c)) == ("yes", "no", "not separated")
    assert not u.separated(a, u.Estimate(5.0, math.nan, math.nan, 1))
    # A ranking ties drivers whose intervals overlap.
    ranks = u.ranking({"rtt": u.from_half_width(50.0, 5.0, 20), "tools": u.from_half_width(30.0, 4.0, 20),
                       "store": u.from_half_width(27.0, 4.0, 20), "auth": u.from_half_width(1.0, 0.5, 20)})
    assert (ranks, u.format_ranking(ranks)) == ([["rtt"], ["tools", "store"], ["auth"]], "rtt > tools ~ store")
    assert u.format_ranking([["a"], ["b"], ["c"], ["d"]]) == "a > b > c"
    assert u.format_ranking(u.ranking({"x": u.from_half_width(3.0, 2.0, 20), "y": u.from_half_width(2.0, 2.0, 20)})) == "x ~ y"


def test_an_estimate_formats_compactly_and_scales_with_its_unit():
    estimate = u.Estimate(0.5, 0.25, 0.75, 12, "seeds")
    assert estimate.format() == "0.50 [0.25, 0.75]" and u.bootstrap([]).format() == "nan"
    assert estimate.format("{:.0f}", with_n=False) == "0 [0, 1]"
    assert estimate.scaled(100).format("{:.0f}", with_n=True) == "50 [25, 75] n=12"
    assert (estimate.scaled(-1).low, estimate.error_bar()) == (-0.75, (0.25, 0.25))
    assert u.bootstrap([5.0]).error_bar() == (0.0, 0.0)  # no interval: no bar either side
    assert estimate.as_dict() == {"value": 0.5, "low": 0.25, "high": 0.75, "n": 12, "of": "seeds", "method": "bootstrap"}


@pytest.mark.parametrize("units", [10, 70])  # a few units, and more than the 64 whose cumulative counts are a matrix
def test_a_statistic_of_drawn_units_is_the_statistic_of_their_samples_repeated(units):
    rng = np.random.default_rng(1)
    turns = [rng.lognormal(0.0, 1.0, rng.integers(1, 20)) for _ in range(units)]
    for q in (0, 13, 50, 90, 99, 100):
        median = u.unit_percentile(turns, q)
        assert median(np.ones((1, units)))[0] == np.percentile(np.concatenate(turns), q)
        counts = rng.integers(0, 3, (20, units))
        counts[:, 0] = 1  # never an empty draw
        repeated = [np.percentile(np.concatenate([np.tile(t, k) for t, k in zip(turns, row)]), q) for row in counts]
        assert median(counts.astype(float)).tolist() == repeated
        assert math.isnan(median(np.zeros((1, units)))[0])  # no unit drawn: no percentile
        # Counts of any shape (..., units): one value per row.
        assert median(counts.reshape(4, 5, units).astype(float)).tolist() == np.reshape(repeated, (4, 5)).tolist()
    assert math.isnan(u.unit_percentile([], 50)(np.ones((1, 0)))[0])
    assert math.isnan(u.unit_percentile([], 50)(np.ones((2, 3, 0)))[1, 2])
    # One drawn sample is its own percentile; between two, numpy's interpolation to the last bit on either side of half.
    assert u.unit_percentile([[3.0], [5.0, 6.0]], 50)(np.array([[1.0, 0.0]]))[0] == 3.0
    for q in (50, 70, 99):
        assert u.unit_percentile([[0.1], [0.7]], q)(np.ones((1, 2)))[0] == np.percentile([0.1, 0.7], q)
    drawn = np.array([[2.0, 0.0, 1.0]])
    assert (u.unit_total([1.0, 2.0, 4.0])(drawn)[0], u.unit_mean([1.0, 2.0, 4.0])(drawn)[0]) == (6.0, 2.0)
    assert u.unit_mean([1.0, 2.0, 4.0])(np.array([[[2.0, 0.0, 1.0], [0.0, 1.0, 1.0]]])).tolist() == [[2.0, 3.0]]


def test_a_resampled_statistic_draws_the_tasks_together_and_the_median_turns_interval_is_over_tasks_not_turns():
    rng = np.random.default_rng(0)
    http = rng.lognormal(3.0, 1.0, 10)
    gain = u.resample(10, lambda c: 1 - u.unit_total(http / 2)(c) / u.unit_total(http)(c))
    # Twice as fast on every task: every resample gives exactly +50%, an interval with no width.
    assert (gain.low, gain.value, gain.high, gain.n, gain.method) == (0.5, 0.5, 0.5, 10, "exact")
    chained = http * rng.uniform(0.5, 0.9, 10)
    gain = u.resample(10, lambda c: 1 - u.unit_total(chained)(c) / u.unit_total(http)(c))
    assert gain.value == pytest.approx(1 - chained.sum() / http.sum())
    assert 0.1 <= gain.low < gain.value < gain.high <= 0.5  # within the per-task gains' range
    # The same interval scipy gives for the same paired statistic written on the samples.
    direct = u.paired_bootstrap(chained, http, lambda a, b: 1 - a.sum() / b.sum())
    assert (gain.low, gain.high) == pytest.approx((direct.low, direct.high), rel=1e-3)
    assert u.resample(10, lambda c: 1 - u.unit_total(chained)(c) / u.unit_total(http)(c)) == gain  # seeded
    assert not u.resample(1, u.unit_mean([3.0])).has_interval and math.isnan(u.resample(0, u.unit_mean([])).value)
    # One task of 30 slow turns among nine of one fast turn each: turns alone would call the median sure (30 of 39
    # turns are slow), but it rests on whether that one task is drawn, so the interval spans both speeds.
    median = u.resample(10, u.unit_percentile([[5.0] * 30] + [[1.0]] * 9, 50))
    assert (median.value, median.low, median.high) == (5.0, 1.0, 5.0)
