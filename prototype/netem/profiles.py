"""Network profiles: the link between one client and the server (RTT, jitter, bandwidth, handshake
round trips), the named presets a sweep walks, and what opening a new connection costs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import attrs
import trio

from ..ranges import Range


def _non_negative_finite(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _positive_or_none(_instance: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be None or a finite number > 0, got {value!r}")


@attrs.frozen
class NetworkProfile:
    """The network between one client and the server.

    All times are in seconds on the trio clock.
    """

    rtt: float = attrs.field(default=0.0, validator=_non_negative_finite)
    """Round-trip time; the one-way delay is ``rtt / 2`` in each direction."""

    jitter: float = attrs.field(default=0.0, validator=_non_negative_finite)
    """Standard deviation of an extra, non-negative delay drawn per chunk sent (exponential, so its
    mean is ``jitter`` too). Delivery stays in order: a chunk never overtakes the one before it."""

    tls_round_trips: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    """TLS handshake round trips: 0 (plain), 1 (TLS 1.3, RFC 8446 §2), 2 (TLS 1.2, RFC 5246 §7.3)."""

    tcp_round_trips: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    """TCP handshake round trips: the three-way handshake costs 1 before data flows (RFC 9293 §3.5)."""

    bandwidth_bytes_per_s: float | None = attrs.field(default=None, validator=_positive_or_none)
    """Sender's link rate; each chunk first waits ``len(chunk) / bandwidth`` to be serialized. None: no
    limit."""

    seed: int = 0
    """Seed of the jitter draws, so a run is repeatable."""

    loss: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.lt(1.0)])
    """Probability that a chunk sent is lost once: TCP resends it after its retransmission timeout
    (``arrivals.RETRANSMIT_TIMEOUT_SECONDS``), and the chunks behind it wait (head-of-line blocking)."""

    @property
    def one_way_delay(self) -> float:
        """Propagation delay of each direction, ``rtt / 2``."""
        return self.rtt / 2

    @property
    def handshake_seconds(self) -> float:
        """What opening a new connection costs before its first request: ``(tcp + tls) * rtt``."""
        return (self.tcp_round_trips + self.tls_round_trips) * self.rtt


# RTT priors: docs/parameters.md §5 sweeps 1, 20, 80 and 150 ms [assumed, no measurement behind them].
RTT_RANGE: Final = Range(0.001, 0.150, "docs/parameters.md §5's priors: same datacenter (1 ms) to between "
                         "continents (150 ms)")
LOOPBACK: Final = NetworkProfile(rtt=0.0)
"""Same host: no added delay."""
SAME_DC: Final = NetworkProfile(rtt=0.001)
"""Same datacenter, 1 ms RTT [assumed]."""
SAME_REGION: Final = NetworkProfile(rtt=0.020)
"""Same cloud region, 20 ms RTT [assumed]."""
CROSS_CONTINENT: Final = NetworkProfile(rtt=0.080)
"""Across a continent, 80 ms RTT [assumed]."""
INTERCONTINENTAL: Final = NetworkProfile(rtt=0.150)
"""Between continents, 150 ms RTT [assumed]."""

PRESETS: Final[Mapping[str, NetworkProfile]] = MappingProxyType(
    {
        "loopback": LOOPBACK,
        "same_dc": SAME_DC,
        "same_region": SAME_REGION,
        "cross_continent": CROSS_CONTINENT,
        "intercontinental": INTERCONTINENTAL,
    }
)
"""The named profiles, in order of distance, for sweeps."""


async def connect_handshake(profile: NetworkProfile) -> None:
    """Sleeps for what opening a new connection costs before the first request can go out.

    TCP's three-way handshake takes 1 RTT before the client may send data (RFC 9293 §3.5); TLS then
    takes 1 more RTT with TLS 1.3 (RFC 8446 §2) or 2 with TLS 1.2 (RFC 5246 §7.3), so
    ``profile.handshake_seconds``. No jitter: the cost is exact. For clients that open a connection
    per request; a kept-alive connection doesn't pay it again.

    Args:
        profile: The network, with its handshake round trips.
    """
    await trio.sleep(profile.handshake_seconds)
