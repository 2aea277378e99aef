"""Server options: limits, auth and the cache switches, each with its reason."""

from __future__ import annotations

import attrs

from ..api.costs import CacheSwitches
from ..designs.suspended import SUSPENSION_TTL_SECONDS

# docs/protocol.md: the real limit is unpublished; OpenAI closed a ~20 MB create with 1009
# (anomalyco/opencode#42572). 16 MiB [ours], configurable.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# docs/protocol.md: creates waiting behind the one in flight [ours].
MAX_QUEUED_CREATES = 32
# WS guide, "Per-connection limits": at most 32 distinct named `stream_id`s per connection (the
# default lane is not counted), and at most 16 responses in flight across all lanes, further
# creates being accepted and queued until one ends.
MAX_STREAMS = 32
MAX_IN_FLIGHT = 16
# WS guide and alpha doc: a WebSocket connection lives at most 60 minutes.
CONNECTION_LIFETIME_SECONDS = 60 * 60
# How long a response in flight at the connection limit may still run before it is cancelled and
# fails with the limit's error [ours]: enough for a long answer to finish, and a bound on a response
# that cannot finish because its client stopped reading (it would hold the connection for ever).
LIFETIME_GRACE_SECONDS = 300.0
# A request head larger than this is refused (431) before any parsing [ours].
MAX_HEAD_BYTES = 64 * 1024
# Seconds a client may take to send its request head [ours]: a stalled client cannot pin a handler.
HEAD_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 10_000
# Largest POST body [ours]: the same 16 MiB as a WebSocket message, so one create fits either way;
# larger bodies get 413.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Seconds a kept-alive HTTP connection may sit idle between requests before the server closes it
# [ours]: longer than the v1 suspension TTL, so tool runs rarely cost an http client its
# connection. (httpx, under openai-python, drops its own idle connections after 5 s.)
HTTP_IDLE_TIMEOUT_SECONDS = 600.0


@attrs.frozen
class ServerConfig:
    api_keys: frozenset[str] | None = None  # None: any non-empty Bearer key is accepted (docs/protocol.md)
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_queued_creates: int = MAX_QUEUED_CREATES  # per lane
    max_streams: int = MAX_STREAMS
    max_in_flight: int = MAX_IN_FLIGHT  # responses in flight per connection, all lanes together
    suspension_ttl: float = SUSPENSION_TTL_SECONDS
    connection_lifetime: float = CONNECTION_LIFETIME_SECONDS
    lifetime_grace: float = LIFETIME_GRACE_SECONDS  # a response in flight at the limit runs at most this much longer
    max_connections: int = MAX_CONNECTIONS
    websocket_enabled: bool = True  # False: an http-only run answers upgrades with 426
    switches: CacheSwitches = CacheSwitches()
    max_body_bytes: int = MAX_BODY_BYTES  # POST /v1/responses body limit; 413 above
    http_idle_timeout: float = HTTP_IDLE_TIMEOUT_SECONDS  # keep-alive idle limit between HTTP requests
    worker: int | None = None  # `serve --workers N`: this process's worker id, sent as x-testbed-worker
