"""HTTP on the WebSocket's port: `POST /v1/responses` (h11), as the real API serves both on one
path (docs/protocol.md, §8).

`serve_http` (serving.py) runs a keep-alive loop over one connection: read a request with h11,
answer it, and go on to the next request on the same connection until the client closes or asks to.
A request the server refuses gets its HTTP status and the flat `{"error": {...}}` body; every refusal
except an oversized or broken body leaves the connection open, because the body was read to its end
first. A create is answered as a stream of SSE events or as the finished Response (answers.py,
through the sinks of sinks.py), over the connection's h11 state machine (exchange.py).

| request                                           | answer                          |
| a path of server/routes.py (retrieve, delete,     | that route's answer; 405 with   |
|   input_items, cancel, models)                    |   its `Allow` otherwise         |
| any other path than /v1/responses                 | 404                             |
| method other than POST (GET without an Upgrade)   | 405, `Allow: POST`              |
| no usable `Authorization: Bearer`, or a wrong key | 401 (shared with the WebSocket) |
| a Content-Type that is not application/json       | 415                             |
| a body over `max_body_bytes`                      | 413, then close                 |
| a body cut short, or not HTTP/1.1                 | 400 `bad_request`, then close   |
| a body still incomplete after the idle timeout    | 408, then close                 |
| not JSON, or not a valid create body              | 400 (codes of docs/protocol.md) |
| `stream: true`                                    | 200 `text/event-stream`         |
| otherwise                                         | 200, the Response as JSON       |

The status line and headers of a stream go out with its first event, so an error found before
the first event (`previous_response_not_found`, a bad item) is still an HTTP error; one found
after it is a flat SSE `error` event, unless the response already ended with its terminal event.
"""

from .exchange import HttpExchange, parse_head, send_simple_error
from .serving import serve_http, serve_request
from .sinks import CollectingSink, SseSink, sse_block, sse_error_block

__all__ = [
    "CollectingSink", "HttpExchange", "SseSink", "parse_head", "send_simple_error", "serve_http", "serve_request",
    "sse_block", "sse_error_block",
]
