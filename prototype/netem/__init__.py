"""WAN emulation over any trio Stream: one-way delay, jitter, bandwidth, handshake round trips.

The testbed runs the same client and server over two kinds of link: in-process memory streams under
trio's virtual clock, and real loopback sockets in real time. Neither has a wide-area network's
latency, so this package adds it:

* `profiles.py`: :class:`NetworkProfile` (RTT, jitter, bandwidth, handshake round trips), the named
  presets, and :func:`connect_handshake`, which charges the round trips a new connection pays before
  its first request (docs/parameters.md §5): TCP's three-way handshake, 1 RTT (RFC 9293 §3.5), then
  the TLS handshake, +1 RTT for TLS 1.3 (RFC 8446 §2) or +2 RTT for TLS 1.2 (RFC 5246 §7.3). A
  WebSocket upgrade (RFC 6455 §4) is an ordinary request and response, so it costs its round trip
  through the delayed stream and is not charged here. A kept-alive connection pays none of this again.
* `delayed.py`: :class:`DelayedStream` wraps a Stream and delivers what is sent ``send_delay`` seconds
  later, without blocking the sender, so a link carries many chunks at once like a real one (two
  sends 1 ms apart arrive 1 ms apart). It can also hold back what it receives by ``receive_delay``,
  which is how the client end of a real socket gets both directions of a round trip.
* `faults.py`: links that break, for experiments and tests: :class:`LinkFaults` (drops at a rate per
  connection, drops as the server sends), :class:`LinkRegistry` (cut every open link: a restart). A
  chunk lost once is :class:`NetworkProfile`'s ``loss``: TCP resends it after its retransmission
  timeout, and the chunks behind it wait.
* `arrivals.py`: when each chunk of one direction arrives (delay, jitter, a loss TCP resends, in order).
* `links.py`: the context managers that run delayed streams' tasks: :func:`open_delayed_stream` wraps
  one stream; :func:`open_emulated_pair` joins a client and a server in memory with ``rtt / 2`` each
  way, for virtual-time runs; :func:`open_emulated_tcp` connects a real socket and delays it on the
  client side, for real-time runs.

Delays are measured on the trio clock (``trio.current_time()``), so under
``trio.testing.MockClock(autojump_threshold=0)`` every arrival time is exact.
"""

from .delayed import DelayedStream
from .links import open_delayed_stream, open_emulated_pair, open_emulated_tcp
from .profiles import (
    CROSS_CONTINENT,
    INTERCONTINENTAL,
    LOOPBACK,
    PRESETS,
    SAME_DC,
    SAME_REGION,
    NetworkProfile,
    connect_handshake,
)

__all__ = [
    "CROSS_CONTINENT",
    "INTERCONTINENTAL",
    "LOOPBACK",
    "PRESETS",
    "SAME_DC",
    "SAME_REGION",
    "DelayedStream",
    "NetworkProfile",
    "connect_handshake",
    "open_delayed_stream",
    "open_emulated_pair",
    "open_emulated_tcp",
]
