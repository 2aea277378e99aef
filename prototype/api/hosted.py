"""The hosted tool service: web search run by the server inside a response.

It is one of the two backends of the sampling loop's suspension point (the other is the client
over the socket): the loop blocks, the service answers after its own latency, and the answer goes
into the model's context (OpenAI blog: the prototype treated a local tool call like a hosted one).
"""

from __future__ import annotations

from collections import OrderedDict

import attrs
import numpy as np
import trio

from ..engine import tokenizer
from ..engine.policy import PlannedSearch

# Results kept so a stateless client that resends a web_search_call item gets the same context; the
# real API keeps hosted results server-side too. Bounded, oldest dropped first.
MAX_KEPT_RESULTS = 10_000


@attrs.define(eq=False)
class HostedToolService:
    results: OrderedDict[str, str] = attrs.Factory(OrderedDict)

    async def search(self, item_id: str, search: PlannedSearch, seed: int) -> str:
        await trio.sleep(search.seconds)
        rng = np.random.default_rng([seed & 0xFFFFFFFF, len(search.query), search.result_tokens])
        result = tokenizer.text_of(rng, search.result_tokens)
        self.results[item_id] = result
        if len(self.results) > MAX_KEPT_RESULTS:
            self.results.popitem(last=False)
        return result

    def result_for(self, item_id: str) -> str:
        return self.results.get(item_id, "")
