"""Figures with their uncertainty: a value, the n behind it and a 95% interval, and claims decided on intervals.

Every table and figure the testbed prints goes through here, so that one rule holds everywhere:

- a statistic of per-task (or per-seed) samples gets a bootstrap interval over those samples
  (`scipy.stats.bootstrap`, BCa; `paired_bootstrap` when two designs ran the same tasks);
- a rate of successes among trials gets the exact Clopper-Pearson interval (`scipy.stats.binomtest`);
- a count of events over an exposure (reconnects per task) gets the exact Poisson (Garwood) interval;
- a sensitivity index carries SALib's own confidence half-width (`from_half_width`);
- a statistic of units with several samples each (a task's turns), or of several designs run on the same units,
  is written as a function of how often each unit is drawn (`resample`, with `unit_total`, `unit_mean` and
  `unit_percentile`): one vectorized bootstrap over the units, fast enough for every cell of a table.

An ordering or a ranking is claimed only where the intervals separate (`order`, `ranking`); elsewhere it is
printed as not separated or tied. The resamples are seeded, so a table is byte-identical run to run; what moves
with the seed is the interval's last digit, never whether a claim holds (the tests check both).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from scipy import stats

CONFIDENCE = 0.95
# scipy's default; at 9,999 resamples the BCa end points of a 10-task median move in the third digit between seeds.
RESAMPLES = 9999
# `resample` passes the resamples to its statistic this many at a time: a statistic of every turn of the drawn tasks
# holds an array of a batch's rows by the turns (2,000 x 1,000 turns is 16 MB).
RESAMPLE_BATCH = 2000
SEED = 0


@attrs.frozen
class Estimate:
    """A figure with its uncertainty."""

    value: float
    """The statistic on the whole sample."""
    low: float
    """The interval's lower end (nan when n is too small to have one)."""
    high: float
    """The interval's upper end."""
    n: int
    """How many independent samples (or events, or trials) it rests on."""
    of: str = "tasks"
    """What n counts: tasks, seeds, events, trials, calls, trajectories."""
    method: str = "bootstrap"
    """How the interval was made: bootstrap, paired bootstrap, exact binomial, exact Poisson, SALib, exact."""

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    def scaled(self, factor: float) -> Estimate:
        """The same estimate in another unit (ms from s, % from a share)."""
        ends = sorted((self.low * factor, self.high * factor))
        return attrs.evolve(self, value=self.value * factor, low=ends[0], high=ends[1])

    def format(self, template: str = "{:.2f}", *, with_n: bool = False) -> str:
        """Compact: `1.04 [0.98, 1.10]`, with ` n=10` when asked; a figure with no interval prints its value alone."""
        text = template.format(self.value)
        if self.has_interval:
            text += f" [{template.format(self.low)}, {template.format(self.high)}]"
        if with_n:
            text += f" n={self.n}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "of": self.of, "method": self.method}

    def error_bar(self) -> tuple[float, float]:
        """Distances below and above the value, for matplotlib's `yerr`/`xerr` (0 where there is no interval)."""
        if not self.has_interval:
            return (0.0, 0.0)
        return (max(self.value - self.low, 0.0), max(self.high - self.value, 0.0))


def _exact(value: float, n: int, of: str) -> Estimate:
    """A sample with no spread: every resample gives the same value, so the interval is that point."""
    return Estimate(value, value, value, n, of, "exact")


def bootstrap(samples: Sequence[float], statistic: Callable[..., float] = np.mean, *, of: str = "tasks",
              seed: int = SEED, confidence: float = CONFIDENCE) -> Estimate:
    """The statistic of independent samples with a BCa bootstrap interval over them.

    Fewer than two samples have no interval (nan ends). A sample whose values are all equal has the exact
    interval [value, value] (BCa is undefined there)."""
    data = np.asarray(samples, dtype=float)
    n = len(data)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, of, "bootstrap")
    value = float(statistic(data))
    if n < 2:
        return Estimate(value, math.nan, math.nan, n, of, "bootstrap")
    if np.all(data == data[0]):
        return _exact(value, n, of)
    low, high = _bca((data,), statistic, value, seed=seed, confidence=confidence, paired=False)
    return Estimate(value, low, high, n, of, "bootstrap")


def paired_bootstrap(first: Sequence[float], second: Sequence[float], statistic: Callable[[np.ndarray, np.ndarray], float],
                     *, of: str = "tasks", seed: int = SEED, confidence: float = CONFIDENCE) -> Estimate:
    """A statistic of two samples measured on the same units (two designs on the same tasks), resampling the units
    together: `paired_bootstrap(http, chained, lambda a, b: a.sum() / b.sum())` is the total-time ratio."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, of, "paired bootstrap")
    value = float(statistic(a, b))
    if n < 2:
        return Estimate(value, math.nan, math.nan, n, of, "paired bootstrap")
    if np.all(a == a[0]) and np.all(b == b[0]):
        return _exact(value, n, of)
    low, high = _bca((a, b), statistic, value, seed=seed, confidence=confidence, paired=True)
    return Estimate(value, low, high, n, of, "paired bootstrap")


def _bca(data: tuple[np.ndarray, ...], statistic: Callable[..., float], value: float, *, seed: int, confidence: float,
         paired: bool, batch: int | None = None) -> tuple[float, float]:
    """The BCa interval's ends (a statistic that takes `axis` is called on all the resamples at once). BCa is undefined when the resamples are (nearly) degenerate (scipy warns and gives
    nan); the percentile interval of the same resamples stands in then."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.bootstrap(data, statistic, paired=paired, n_resamples=RESAMPLES, confidence_level=confidence,
                                 method="BCa", rng=np.random.default_rng(seed), batch=batch)
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):
        tail = (1 - confidence) / 2
        low, high = (float(q) for q in np.quantile(np.asarray(result.bootstrap_distribution), [tail, 1 - tail]))
    return min(low, value), max(high, value)


def resample(n: int, statistic: Callable[[np.ndarray], np.ndarray], *, of: str = "tasks", method: str = "bootstrap",
             seed: int = SEED, confidence: float = CONFIDENCE, interval: bool = True) -> Estimate:
    """A statistic of `n` independent units (tasks, trajectories) with a BCa bootstrap interval over the units.

    `statistic(counts)` takes how many times each unit is drawn, an array of shape (..., n), and returns one value
    per row; the whole sample is a row of ones. Written so, one statistic covers units with several samples each
    (the turns of a task: `unit_percentile`), several designs measured on the same units (a ratio of two
    `unit_total`s resamples the tasks of both together) and any n, and it runs over all the resamples at once.
    `interval` false gives the value alone (NaN ends), for a caller that needs only the point."""
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, of, method)
    value = float(np.asarray(statistic(np.ones((1, n))))[0])
    if n < 2 or not interval:
        return Estimate(value, math.nan, math.nan, n, of, method)

    def on_indices(indices: np.ndarray, axis: int = -1) -> np.ndarray:
        drawn = np.asarray(indices, dtype=np.intp)
        flat = drawn.reshape(-1, drawn.shape[-1])
        offsets = (np.arange(len(flat)) * n)[:, None]
        counts = np.bincount((flat + offsets).ravel(), minlength=len(flat) * n).reshape(len(flat), n)
        return np.asarray(statistic(counts.astype(float))).reshape(drawn.shape[:-1])

    low, high = _bca((np.arange(n, dtype=float),), on_indices, value, seed=seed, confidence=confidence, paired=False,
                     batch=RESAMPLE_BATCH)
    if low == high == value:  # every resample gave the value: a sample with no spread
        return _exact(value, n, of)
    return Estimate(value, low, high, n, of, method)


def unit_total(values: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """The total of one value per unit over the drawn units (for `resample`)."""
    column = np.asarray(values, dtype=float)
    return lambda counts: counts @ column


def unit_mean(values: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """The mean of one value per unit over the drawn units (for `resample`)."""
    column = np.asarray(values, dtype=float)
    return lambda counts: (counts @ column) / counts.sum(axis=-1)


def unit_percentile(samples: Sequence[Sequence[float]], q: float) -> Callable[[np.ndarray], np.ndarray]:
    """The q-th percentile (numpy's linear interpolation) of the samples of the drawn units, each unit's samples
    counted as often as the unit is drawn: the median turn of the drawn tasks (for `resample`). On the whole
    sample it is `np.percentile` of all the samples."""
    values = np.concatenate([np.asarray(s, dtype=float) for s in samples]) if len(samples) else np.array([])
    units = np.repeat(np.arange(len(samples)), [len(s) for s in samples])
    order = np.argsort(values, kind="stable")
    values, units = values[order], units[order]
    share = q / 100
    # How many samples of each unit lie at or below each sorted value: with the counts, a matrix product gives the
    # drawn samples at or below it, for every resample at once (a cumulative sum over the units' samples is slower
    # for the few units of a table's cell; beyond a few dozen units the matrix is too large and the sum is used).
    below_of_unit = np.cumsum(np.arange(len(samples))[:, None] == units[None, :], axis=-1, dtype=float) if len(samples) <= 64 else None

    def cumulative_of(counts: np.ndarray) -> np.ndarray:
        if below_of_unit is not None:
            return counts @ below_of_unit
        return np.cumsum(counts[..., units], axis=-1)

    def statistic(counts: np.ndarray) -> np.ndarray:
        cumulative = cumulative_of(counts)  # drawn samples at or below each sorted value
        total = cumulative[..., -1] if values.size else np.zeros(counts.shape[:-1])
        # np.percentile's "linear" method on the drawn samples, repeated as often as their units are drawn.
        virtual = (total - 1) * share
        below = np.floor(virtual)
        gamma = virtual - below
        above = np.minimum(below + 1, total - 1)

        def at(index: np.ndarray) -> np.ndarray:
            position = (cumulative <= index[..., None]).sum(axis=-1)
            return values[np.minimum(position, values.size - 1)] if values.size else np.full(index.shape, math.nan)

        a, b = at(below), at(above)
        result = np.where(gamma >= 0.5, b - (b - a) * (1 - gamma), a + (b - a) * gamma)
        return np.where(total > 0, result, math.nan)

    return statistic


def rate(successes: int, trials: int, *, of: str = "trials", confidence: float = CONFIDENCE) -> Estimate:
    """A share of successes among trials with its exact (Clopper-Pearson) interval."""
    if trials <= 0:
        return Estimate(math.nan, math.nan, math.nan, 0, of, "exact binomial")
    interval = stats.binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="exact")
    return Estimate(successes / trials, float(interval.low), float(interval.high), trials, of, "exact binomial")


def events_per(events: int, exposure: float, *, of: str = "events", confidence: float = CONFIDENCE) -> Estimate:
    """A count of events over an exposure (tasks, hours) with the exact Poisson (Garwood) interval; n is the
    number of events, which is what the interval's width rests on."""
    if exposure <= 0:
        return Estimate(math.nan, math.nan, math.nan, events, of, "exact Poisson")
    tail = (1 - confidence) / 2
    low = 0.0 if events == 0 else stats.chi2.ppf(tail, 2 * events) / 2
    high = stats.chi2.ppf(1 - tail, 2 * events + 2) / 2
    return Estimate(events / exposure, float(low) / exposure, float(high) / exposure, events, of, "exact Poisson")


def from_half_width(value: float, half_width: float, n: int, *, of: str = "trajectories", method: str = "SALib") -> Estimate:
    """An index with a symmetric confidence half-width computed elsewhere (SALib's `mu_star_conf`, `ST_conf`)."""
    return Estimate(float(value), float(value - half_width), float(value + half_width), n, of, method)


def separated(a: Estimate, b: Estimate) -> bool:
    """Whether the two intervals do not overlap (a figure without an interval separates from nothing)."""
    if not (a.has_interval and b.has_interval):
        return False
    return a.high < b.low or b.high < a.low


def order(estimates: Mapping[str, Estimate], *, ascending: bool = True) -> str:
    """The names in order of value, joined by `<` where neighbours' intervals separate and by `~` where they do
    not: `chained < suspended ~ http`."""
    names = sorted(estimates, key=lambda name: estimates[name].value, reverse=not ascending)
    if not names:
        return ""
    text = names[0]
    sign = "<" if ascending else ">"
    for previous, name in zip(names, names[1:]):
        text += f" {sign if separated(estimates[previous], estimates[name]) else '~'} {name}"
    return text


def holds(smaller: Estimate, larger: Estimate) -> str:
    """Whether `smaller < larger` holds on the intervals: "yes" (separated that way), "no" (separated the other way)
    or "not separated"."""
    if separated(smaller, larger):
        return "yes" if smaller.value < larger.value else "no"
    return "not separated"


def ranking(indices: Mapping[str, Estimate]) -> list[list[str]]:
    """Names in decreasing order of their index, grouped into ranks: a name joins the rank above it when its
    interval overlaps the interval of any name in that rank (so a ranking never claims an order the intervals do
    not carry)."""
    names = sorted(indices, key=lambda name: indices[name].value, reverse=True)
    ranks: list[list[str]] = []
    for name in names:
        if ranks and any(not separated(indices[other], indices[name]) for other in ranks[-1]):
            ranks[-1].append(name)
        else:
            ranks.append([name])
    return ranks


def format_ranking(ranks: Sequence[Sequence[str]], top: int = 3) -> str:
    """`a > b ~ c (tied)`: the ranks that hold the first `top` names, ties joined by `~`."""
    shown: list[str] = []
    count = 0
    for rank in ranks:
        if count >= top:
            break
        shown.append(" ~ ".join(rank))
        count += len(rank)
    return " > ".join(shown)
