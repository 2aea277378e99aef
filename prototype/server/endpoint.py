"""What both transports of `/v1/responses` share: the path, the headers they read, bearer auth,
and the server state a connection of either kind uses (the API service, the options, the records).

`app.py` (the listener) and `http.py` (the POST handler) both build on this module, so the
dependency runs one way: app -> http -> endpoint. The wire's names (path, headers) are in
protocol/wire.py, shared with the client.
"""

from __future__ import annotations

import attrs
import trio

from .. import metrics
from ..api.service import ApiService
from ..protocol.errors import ProtocolError
from .config import ServerConfig


def path_of(target: str) -> str:
    return target.split("?", 1)[0]


def bearer_key(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


@attrs.define(eq=False)
class Endpoint:
    """The state every connection of the server uses, whatever its transport."""

    api: ApiService = attrs.Factory(ApiService)
    config: ServerConfig = attrs.Factory(ServerConfig)
    # One record per response: which client spoke (user agent) and how it used the protocol
    # (chained or full context, warm-up, stream, appends, ...) with the response's phase totals.
    records: metrics.ClientRecords = attrs.Factory(metrics.ClientRecords)
    connections_opened: int = 0  # serial numbers for the records' `connection` field
    # Shutdown (SIGTERM, app.drain): no new work; idle keep-alive waits and responses past the
    # grace are cut.
    draining: bool = False
    http_idle: set = attrs.Factory(set)  # cancel scopes of HTTP connections waiting for a next request
    http_in_flight: set = attrs.Factory(set)  # cancel scopes of HTTP responses being produced
    _changed: trio.Event = attrs.Factory(trio.Event)  # set when a connection or an HTTP response ends

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, done) -> None:
        """Wait until `done()` holds, re-checked whenever a connection or an HTTP response ends."""
        while not done():
            await self._changed.wait()

    def check_auth(self, headers: dict[str, str]) -> str:
        key = bearer_key(headers)
        if key is None or (self.config.api_keys is not None and key not in self.config.api_keys):
            raise ProtocolError(
                "invalid_api_key",
                "Incorrect API key provided." if key else "Missing bearer authentication in header.",
                status=401,
            )
        return key

    def next_connection_number(self) -> int:
        self.connections_opened += 1
        return self.connections_opened
