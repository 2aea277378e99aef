"""The names both ends of the wire agree on: the endpoint's path, the headers the testbed reads, the
OpenAI-Beta values that select a WebSocket design, and the two ways a client uses the HTTP endpoint
(docs/protocol.md). The server and the client harness import them from here, so they cannot drift.
"""

from __future__ import annotations

RESPONSES_PATH = "/v1/responses"
# Asks the server for per-response phase timings (docs/protocol.md) [ours].
TIMING_HEADER = "x-responsesapi-include-timing-metrics"

# The WebSocket designs, and the `OpenAI-Beta: responses_websockets=<date>` value that selects each
# (Codex `client.rs`; docs/protocol.md).
SUSPENDED = "suspended"  # wire v1
CHAINED = "chained"  # wire v2
BETA_SUSPENDED = "2026-02-04"
BETA_CHAINED = "2026-02-06"

# The HTTP variants: `stateless` resends the whole conversation with `store: false`; `stored` sends
# only what is new, with `store: true` and `previous_response_id`.
STATELESS = "stateless"
STORED = "stored"
VARIANTS = (STATELESS, STORED)

# Bytes per socket read on a WebSocket, both ends (trio's own default for a SocketStream).
# trio-websocket reads 4 KiB at a time by default, so a 70 KB chained request took ~17 reads and as
# many passes through wsproto's parser (docs/speed.md) [ours].
WS_RECEIVE_BYTES = 64 * 1024
