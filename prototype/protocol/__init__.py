"""The protocol core: items, events, the Response object and the JSON codec.

Sans-IO: nothing here imports trio or touches a socket, so the same code serves the WebSocket and
HTTP shells, the client harness and the property tests.
"""

from .codec import decode_client_event, encode, encode_event, loads_object, parse_create_body
from .errors import ProtocolError
from .events import CreateRequest, ResponseAppend, ResponseCreate, ResponseProcessed, ResponseSteer, ToolDef
from .items import FunctionCall, FunctionCallOutput, Item, Message, OpaqueItem, WebSearchCall, parse_input, parse_item
from .response import Response, Usage

__all__ = [
    "CreateRequest", "FunctionCall", "FunctionCallOutput", "Item", "Message", "OpaqueItem", "ProtocolError",
    "Response", "ResponseAppend", "ResponseCreate", "ResponseProcessed", "ResponseSteer", "ToolDef", "Usage",
    "WebSearchCall", "decode_client_event", "encode", "encode_event", "loads_object", "parse_create_body",
    "parse_input", "parse_item",
]
