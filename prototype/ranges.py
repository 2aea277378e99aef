"""A plausible range for an [assumed] parameter, kept as data next to the parameter's default.

docs/parameters.md labels a value [assumed] when no public source gives it. Each such value carries a
`Range`: the lowest and highest values a reader could defend, in the parameter's own unit, and the
reasoning or source behind them. `prototype/assumptions.py` gathers them for the table in
docs/parameters.md and for `experiments.sensitivity`, which sweeps them.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Range:
    """The plausible values of an [assumed] parameter: `low` to `high` (inclusive) and why."""

    low: float
    """The lowest plausible value, in the parameter's unit."""
    high: float
    """The highest plausible value, in the parameter's unit."""
    why: str
    """The reasoning or public source behind the bounds."""

    def __attrs_post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"a range needs low <= high, got {self.low!r} > {self.high!r}")

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high


__all__ = ["Range"]
