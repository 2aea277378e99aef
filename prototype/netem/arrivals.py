"""When each chunk of one direction of an emulated link arrives: the one-way delay, a jitter drawn per
chunk, and a loss that TCP repairs by resending; in order, never before the chunk sent before it.

Times are on the trio clock (``trio.current_time()``), so under
``trio.testing.MockClock(autojump_threshold=0)`` every arrival is exact.
"""

from __future__ import annotations

import math
import random
from typing import Final

# A lost segment is resent when the sender's retransmission timer fires: Linux's minimum RTO is
# 200 ms (TCP_RTO_MIN, include/net/tcp.h), and the timer runs from the send, so the resent copy
# arrives one RTO plus the one-way delay after the original would have.
RETRANSMIT_TIMEOUT_SECONDS: Final = 0.2


class Arrivals:
    """The arrival times of one direction's chunks, drawn from generators of their own.

    Each draw has its own generator, seeded by name (a string seed hashes the same in every
    process), so the draws of one direction depend neither on the other direction's nor on each
    other's.

    Attributes:
        delay: One-way delay of every chunk, in seconds.
        jitter: Mean (and standard deviation) of an exponential extra delay drawn per chunk.
        loss: Probability that a chunk is lost once: it arrives ``RETRANSMIT_TIMEOUT_SECONDS`` late,
            and the chunks after it wait for it (in-order delivery: head-of-line blocking).
        last: The latest arrival handed out so far.
    """

    def __init__(self, delay: float, jitter: float, loss: float, *, jitter_seed: str, loss_seed: str) -> None:
        self.delay = delay
        self.jitter = jitter
        self.loss = loss
        self.last = -math.inf
        self._jitter_rng = random.Random(jitter_seed)
        self._loss_rng = random.Random(loss_seed)

    @property
    def delays(self) -> bool:
        """Whether any chunk can arrive later than it was sent."""
        return self.delay > 0 or self.jitter > 0 or self.loss > 0

    def next(self, now: float, *, can_be_lost: bool = True) -> float:
        """When a chunk handed over at ``now`` arrives; a chunk that cannot be lost draws no loss."""
        delay = self.delay
        if self.jitter > 0:
            delay += self._jitter_rng.expovariate(1.0 / self.jitter)
        if can_be_lost and self.loss > 0 and self._loss_rng.random() < self.loss:
            delay += RETRANSMIT_TIMEOUT_SECONDS
        self.last = max(now + delay, self.last)
        return self.last
