"""A WebSocket connection's client records: who spoke and how it used the protocol.

One record per `response.create` that reached a lane's worker, whatever its outcome, and one per
frame refused before it was queued, appended to the server's bounded log (`ResponsesServer.records`)
that the access log and the load reports read (docs/metrics.md).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from ... import metrics
from ...protocol.errors import ProtocolError


@attrs.define(eq=False)
class ConnectionInfo:
    """What the handshake told us, recorded with the connection's timing records."""

    design: str
    api_key: str | None
    include_timing: bool = False
    user_agent: str = ""
    connection: int = 0  # the server's serial number for this connection, in the client records
    multi_agent: bool = False  # `OpenAI-Beta: responses_multi_agent=v1`: `multi_agent` and `response.inject`


@attrs.define(eq=False)
class ClientRecords:
    info: ConnectionInfo
    log: Any = None  # the server's bounded log of client records (`ResponsesServer.records`); None keeps none
    appends: int = 0  # v1 `response.append` frames delivered on this connection
    append_bytes: int = 0  # their total size, for the records' `request_bytes`

    def appended(self, size: int) -> None:
        """A v1 `response.append` of `size` bytes was delivered."""
        self.appends += 1
        self.append_bytes += size

    def protocol_choices(self, request) -> dict[str, Any]:
        info = self.info
        return metrics.protocol_choices(
            request, transport="websocket", design=info.design, user_agent=info.user_agent, connection=info.connection
        )

    def keep(self, phase_log: metrics.PhaseLog, response, outcome: str, appends: int, request_bytes: int = 0,
             announced_id: str | None = None) -> None:
        """One record per `response.create` that reached the worker, whatever its outcome.
        `request_bytes`: the client's frames for it (the create and, in v1, its appends);
        `announced_id`: the id its `response.created` gave, for a response that did not return."""
        if self.log is None:
            return
        record = dict(phase_log.client or {})
        record.update(
            started_at_s=phase_log.spans[0][1] if phase_log.spans else None,  # the create's arrival (the queue span)
            at_s=trio.current_time(),
            response_id=response.id if response is not None else announced_id,
            outcome=outcome,
            appends=appends,
            request_bytes=request_bytes,
            timing_requested=self.info.include_timing,
            phases_ms={k: round(v * 1000, 3) for k, v in phase_log.totals().items()},
            usage=response.usage.to_dict() if response is not None else None,
        )
        self.log.append(record)

    def refusal(self, error: ProtocolError) -> None:
        """A frame refused before it was queued (e.g. a create with `stream_id`)."""
        if self.log is None:
            return
        info = self.info
        self.log.append({
            "user_agent": info.user_agent, "transport": "websocket", "design": info.design, "connection": info.connection,
            "at_s": trio.current_time(), "response_id": None, "outcome": f"error:{error.code}", "param": error.param,
            "stream_id": error.param == "stream_id",
        })
