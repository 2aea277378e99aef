"""Fitting the testbed's models to observed rounds: pure numpy, no I/O (`python -m prototype calibrate` reads and prints).

* `round_time_fit`: least squares of a round's model time on the latency model's terms (prototype/engine/latency.py),
  `seconds = fixed + uncached / prefill rate + output / decode rate`. The fit leaves out the model's cache-attention
  term (n·C/Q), which matters only for long uncached appends on long prefixes; `fixed` takes in everything a round
  pays regardless of size (API work, queueing, network, time to the first token). Coefficients are kept
  non-negative (the best of the 2³ subsets of terms with non-negative least-squares coefficients), so a term the data
  cannot see comes out 0 and its rate infinite rather than negative.
* `engine_timing_fit`: the same model's engine terms fitted to a real engine's own calls (`experiments.real_engine`):
  time to the first token on the prefill the engine computed (overhead and prefill rate), and the decode rate.
* `holdout_split`, `percentage_errors`: a fit scored on the rounds after those it was fitted to; a fit needs one
  round more than its coefficients and a score one more (MIN_FIT_ROUNDS, MIN_SCORED_ROUNDS), so that neither is an
  exact interpolation reported as a perfect fit.
* `distribution`: quantiles and mean of one quantity; `tool_tail`: the share of calls over a threshold and the share
  of tool time they hold (TraceLab: 4% of calls over a minute hold ~85% of tool time).
* `lognormal`: median and log-sd of positive values (the generator's LN(median, sigma) parameters);
  `lognormal_mixture`: a 1-D Gaussian mixture on log values by EM (the generator's tool-time mixture).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import attrs
import numpy as np

QUANTILES = (0.1, 0.5, 0.9, 0.99)
COEFFICIENTS = 3  # of a round-time fit: fixed, per uncached token, per output token
# A fit needs one round more than its coefficients, or it interpolates them exactly and its residuals (rmse 0)
# say nothing; a held-out score needs one round more than that, to score.
MIN_FIT_ROUNDS = COEFFICIENTS + 1
MIN_SCORED_ROUNDS = MIN_FIT_ROUNDS + 1


@attrs.frozen
class RoundTimeFit:
    """`seconds = fixed_s + uncached / prefill_tokens_per_s + output / decode_tokens_per_s` fitted to `n` rounds.

    Attributes:
        fixed_s, prefill_tokens_per_s, decode_tokens_per_s: The fitted model (a rate is inf where its term is 0).
        stderr: Standard errors of (fixed_s, seconds per uncached token, seconds per output token).
        rmse_s: Root mean square of the residuals; r2: the share of variance explained.
        residual_quantiles: (p10, p50, p90) of observed - fitted seconds.
        n: Rounds fitted.
    """

    fixed_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    stderr: tuple[float, float, float]
    rmse_s: float
    r2: float
    residual_quantiles: tuple[float, float, float]
    n: int

    def predict(self, uncached: np.ndarray | float, output: np.ndarray | float) -> np.ndarray | float:
        return self.fixed_s + np.asarray(uncached) / self.prefill_tokens_per_s + np.asarray(output) / self.decode_tokens_per_s


def _rate(seconds_per_token: float) -> float:
    return math.inf if seconds_per_token <= 0 else 1.0 / seconds_per_token


def round_time_fit(uncached: Sequence[float], output: Sequence[float], seconds: Sequence[float]) -> RoundTimeFit:
    """Non-negative least squares of `seconds` on (1, uncached, output); needs MIN_FIT_ROUNDS rounds."""
    u, o, y = (np.asarray(v, dtype=float) for v in (uncached, output, seconds))
    if not (u.shape == o.shape == y.shape) or u.ndim != 1:
        raise ValueError("uncached, output and seconds must be 1-D and of one length")
    n = len(y)
    if n < MIN_FIT_ROUNDS:
        raise ValueError(f"a fit of {COEFFICIENTS} coefficients needs at least {MIN_FIT_ROUNDS} timed rounds (one more than "
                         f"its coefficients, or it interpolates them), got {n}")
    if not (np.isfinite(u).all() and np.isfinite(o).all() and np.isfinite(y).all()):
        raise ValueError("non-finite values")
    X = np.column_stack([np.ones(n), u, o])
    best: tuple[float, np.ndarray] | None = None
    for size in range(3, 0, -1):
        for columns in itertools.combinations(range(3), size):
            coef = np.zeros(3)
            sub, *_ = np.linalg.lstsq(X[:, columns], y, rcond=None)
            if (sub < 0).any():
                continue
            coef[list(columns)] = sub
            sse = float(((y - X @ coef) ** 2).sum())
            if best is None or sse < best[0] - 1e-12:
                best = (sse, coef)
    if best is None:  # every subset had a negative coefficient: the mean alone
        best = (float(((y - y.mean()) ** 2).sum()), np.array([y.mean(), 0.0, 0.0]))
    sse, coef = best
    residuals = y - X @ coef
    active = coef > 0
    dof = max(1, n - int(active.sum()))
    stderr = np.full(3, math.nan)
    if active.any():
        Xa = X[:, active]
        try:
            cov = np.linalg.inv(Xa.T @ Xa) * (sse / dof)
            stderr[active] = np.sqrt(np.clip(np.diag(cov), 0, None))
        except np.linalg.LinAlgError:
            pass
    variance = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - sse / variance if variance > 0 else math.nan
    p10, p50, p90 = (float(q) for q in np.quantile(residuals, (0.1, 0.5, 0.9)))
    return RoundTimeFit(
        fixed_s=float(coef[0]), prefill_tokens_per_s=_rate(coef[1]), decode_tokens_per_s=_rate(coef[2]),
        stderr=tuple(float(s) for s in stderr), rmse_s=math.sqrt(sse / n), r2=r2, residual_quantiles=(p10, p50, p90), n=n,
    )


@attrs.frozen
class EngineTimingFit:
    """The latency model's engine terms fitted to a real engine's calls.

    Attributes:
        first_token: `ttft = fixed_s + prefill computed / prefill_tokens_per_s` (a `RoundTimeFit` with no output term:
            its decode rate is inf): the request overhead and the prefill rate.
        decode_tokens_per_s: Every token after a call's first over the time they took, all calls pooled.
    """

    first_token: RoundTimeFit
    decode_tokens_per_s: float

    def call_seconds(self, prefill_tokens: np.ndarray | float, output_tokens: np.ndarray | float) -> np.ndarray | float:
        """A call's predicted time from request to last token: its first token, then one decode step per later token."""
        later = np.maximum(np.asarray(output_tokens, dtype=float) - 1, 0)
        return self.first_token.predict(prefill_tokens, 0.0) + later / self.decode_tokens_per_s


def engine_timing_fit(prefill_tokens: Sequence[float], ttft_s: Sequence[float], output_tokens: Sequence[float],
                      decode_s: Sequence[float]) -> EngineTimingFit:
    """Fits `EngineTimingFit` to calls: per call the prefill the engine computed (its own counters, not the prompt:
    a cache hit or a held sequence is not prefilled), the time to its first token, its sampled tokens and the time from
    its first token to its last. Needs MIN_FIT_ROUNDS calls and some decode time."""
    later = float(np.maximum(np.asarray(output_tokens, dtype=float) - 1, 0).sum())
    decoding = float(np.asarray(decode_s, dtype=float).sum())
    if decoding <= 0 or later <= 0:
        raise ValueError("a decode rate needs calls that sampled more than one token, over some time")
    return EngineTimingFit(round_time_fit(prefill_tokens, [0.0] * len(ttft_s), ttft_s), later / decoding)

def distribution(values: Sequence[float]) -> dict[str, float]:
    """n, mean and the `QUANTILES` (keys p10, p50, p90, p99); NaNs when empty."""
    a = np.asarray(values, dtype=float)
    out = {"n": float(len(a)), "mean": float(a.mean()) if len(a) else math.nan}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = float(np.quantile(a, q)) if len(a) else math.nan
    return out


def tool_tail(seconds: Sequence[float], threshold_s: float = 60.0) -> tuple[float, float]:
    """(share of calls over `threshold_s`, share of total tool time in those calls); NaNs when empty."""
    a = np.asarray(seconds, dtype=float)
    if not len(a) or a.sum() <= 0:
        return math.nan, math.nan
    over = a > threshold_s
    return float(over.mean()), float(a[over].sum() / a.sum())


def lognormal(values: Sequence[float]) -> tuple[float, float]:
    """(median, log-sd) of the positive values: exp(mean log), sd of log."""
    a = np.asarray(values, dtype=float)
    a = a[a > 0]
    if not len(a):
        raise ValueError("no positive values")
    logs = np.log(a)
    return float(math.exp(logs.mean())), float(logs.std())


def lognormal_mixture(values: Sequence[float], components: int = 3, *,
                      iterations: int = 200) -> tuple[tuple[float, float, float], ...]:
    """A mixture of lognormals fitted by EM on log values: ((weight, median, sigma), ...) by increasing median.

    With fewer than 10 values per component it fits fewer components (a single lognormal at the least)."""
    a = np.asarray(values, dtype=float)
    a = a[a > 0]
    if not len(a):
        raise ValueError("no positive values")
    k = max(1, min(components, len(a) // 10))
    x = np.log(a)
    if k == 1:
        return ((1.0, float(math.exp(x.mean())), float(max(x.std(), 1e-3))),)
    means = np.quantile(x, (np.arange(k) + 0.5) / k)
    sigmas = np.full(k, max(x.std() / k, 1e-2))
    weights = np.full(k, 1.0 / k)
    for _ in range(iterations):
        log_p = np.log(weights) - np.log(sigmas) - 0.5 * ((x[:, None] - means) / sigmas) ** 2
        log_p -= log_p.max(axis=1, keepdims=True)
        resp = np.exp(log_p)
        resp /= resp.sum(axis=1, keepdims=True)
        mass = resp.sum(axis=0) + 1e-12
        new_means = (resp * x[:, None]).sum(axis=0) / mass
        sigmas = np.sqrt((resp * (x[:, None] - new_means) ** 2).sum(axis=0) / mass).clip(1e-2)
        weights = mass / mass.sum()
        if np.allclose(new_means, means, atol=1e-7):
            means = new_means
            break
        means = new_means
    order = np.argsort(means)
    return tuple((float(weights[i]), float(math.exp(means[i])), float(sigmas[i])) for i in order)


# --- scoring a fit on rounds it was not fitted to ------------------------------------------------------------------


def holdout_share(share: float) -> float:
    """`share` if it can be a held-out share (in (0, 1)); else ValueError."""
    if not 0 < share < 1:
        raise ValueError(f"the held-out share must be in (0, 1), got {share!r}")
    return share


def holdout_split(n: int, share: float) -> tuple[range, range]:
    """(fitted, held out): the first rounds of `n` (in trace order) to fit, the last `share` of them to score, so a
    fit is judged on rounds that come after everything it saw. At least MIN_FIT_ROUNDS rounds are fitted and 1 held
    out: ValueError when `n` < MIN_SCORED_ROUNDS."""
    holdout_share(share)
    if n < MIN_SCORED_ROUNDS:
        raise ValueError(f"a held-out score needs at least {MIN_SCORED_ROUNDS} timed rounds ({MIN_FIT_ROUNDS} to fit, "
                         f"1 to score), got {n}")
    held = min(n - MIN_FIT_ROUNDS, max(1, round(n * share)))
    return range(0, n - held), range(n - held, n)


def percentage_errors(predicted: Sequence[float], observed: Sequence[float]) -> dict[str, float]:
    """Absolute percentage error per round, |predicted - observed| / observed x 100: n, median and p90. Rounds
    observed at 0 s have no percentage error and are left out (counted in `zero`)."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    if p.shape != o.shape:
        raise ValueError("predicted and observed must be of one length")
    keep = o > 0
    errors = 100 * np.abs(p[keep] - o[keep]) / o[keep]
    if not len(errors):
        return {"n": 0.0, "zero": float((~keep).sum()), "median": math.nan, "p90": math.nan}
    return {"n": float(len(errors)), "zero": float((~keep).sum()), "median": float(np.median(errors)),
            "p90": float(np.quantile(errors, 0.9))}
