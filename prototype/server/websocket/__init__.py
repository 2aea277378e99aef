"""One WebSocket connection: read frames, answer bad ones, run each lane's creates FIFO.

A session (session.py) holds the connection's state and runs its tasks. Its reader
(reading.py) decodes frames and dispatches them; each lane (`stream_id`; no `stream_id` is the
default lane) has a worker task (lanes.py) that runs its `response.create`s in arrival order (WS
guide: one response in flight per lane, the rest queued, never rejected until the queue is full);
lanes run side by side. A v1 `response.append` bypasses the queue and goes straight to the
suspended rollout. `response.steer` goes to the connection's steering book (protocol/steering.py),
which steering.py drives: it answers with `response.steer.accepted` or `.failed`, stops the target at
its next safe boundary, sends `.pending` after a response that waits for client tool output, and
runs the automatic successor on the target's lane. `response.inject` goes to the injection book
(protocol/inject.py), which injection.py drives. The lifetime limit and a drain close the connection
once the responses in flight have ended (closing.py); every response and refused frame leaves a
client record (records.py). Every task the connection starts lives in its nursery and ends with it.
"""

from .closing import CLOSE_HANDSHAKE_SECONDS
from .lanes import Lane
from .records import ConnectionInfo
from .session import WebSocketSession

__all__ = ["CLOSE_HANDSHAKE_SECONDS", "ConnectionInfo", "Lane", "WebSocketSession"]
