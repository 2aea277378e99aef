"""What every figure shares: one colour per phase and per design, so a reader can compare a suspended, a
chained and an http timeline, or any two panels, at a glance; the phases' order and their legend labels, and a
marker per design."""

from __future__ import annotations

from .. import benchmark, metrics
from ..analysis import NETWORK_CLIENT, TOOL
from ..client.harness import CHAINED, SUSPENDED

# One colour per phase, for every design [ours]. API work before inference in warm colours, the
# model in blues, tools in greens, post-inference in grey-brown, the wire in light grey.
PHASE_COLORS: dict[str, str] = {
    metrics.VALIDATE: "#fdae61",
    metrics.SAFETY: "#f46d43",
    metrics.RENDER: "#fee08b",
    metrics.ROUTE: "#d53e4f",
    metrics.STORE_READ: "#9e0142",
    metrics.QUEUE: "#bababa",
    metrics.PREFILL: "#74add1",
    metrics.DECODE: "#313695",
    metrics.HOSTED_TOOL: "#1a9850",
    metrics.POST: "#8c510a",
    metrics.POST_OVERLAPPED: "#dfc27d",
    NETWORK_CLIENT: "#e0e0e0",
    TOOL: "#a6d96a",
}

PHASE_ORDER: tuple[str, ...] = metrics.PRE_INFERENCE + (
    metrics.QUEUE, metrics.PREFILL, metrics.DECODE, metrics.HOSTED_TOOL, metrics.POST, metrics.POST_OVERLAPPED,
    NETWORK_CLIENT, TOOL,
)

PHASE_LABELS: dict[str, str] = {
    NETWORK_CLIENT: "network + client",
    TOOL: "client tool",
    metrics.HOSTED_TOOL: "hosted tool (web_search)",
    metrics.POST_OVERLAPPED: "post (overlapped)",
}


DESIGN_COLORS: dict[str, str] = {
    benchmark.HTTP: "#d62728",
    benchmark.HTTP_STORED: "#ff7f0e",
    CHAINED: "#1f77b4",
    SUSPENDED: "#2ca02c",
}

DESIGN_MARKERS: dict[str, str] = {benchmark.HTTP: "o", benchmark.HTTP_STORED: "v", CHAINED: "s", SUSPENDED: "^"}
