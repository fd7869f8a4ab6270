"""Who runs next: FIFO admission while KV slots allow, and a per-step token budget.

Decode rows always get their tokens; what is left of ``max_num_batched_tokens`` goes to prompt
chunks in arrival order, so a long prompt is prefilled over several steps instead of stalling the
streams already running (chunked prefill, as in vLLM and TGI). Rows that feed many tokens a step
(contrastive candidates, drafts) could leave nothing for prompts, so prompts always keep a floor
of the budget: an admitted request's prefill always makes progress.
"""

from __future__ import annotations

from collections import deque

from decoding.kv_cache import KVPool
from decoding.request import Request

PREFILL_FLOOR_FRACTION = 0.25  # share of max_num_batched_tokens that prompt chunks always get


class Scheduler:
    def __init__(self, pool: KVPool, max_num_batched_tokens: int) -> None:
        self.pool = pool
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_floor = max(1, int(max_num_batched_tokens * PREFILL_FLOOR_FRACTION))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests to running, first come first served, while their slots fit."""
        admitted = []
        while self.waiting and self.pool.num_free >= self.waiting[0].strategy.num_slots:
            request = self.waiting.popleft()
            request.strategy.assign_slots([self.pool.allocate() for _ in range(request.strategy.num_slots)])
            self.running.append(request)
            admitted.append(request)
        return admitted

    def prefill_budget(self, num_decode_tokens: int) -> int:
        """Prompt tokens this step may carry after the decode rows' ``num_decode_tokens``."""
        return max(self.max_num_batched_tokens - num_decode_tokens, self.prefill_floor)

    def remove(self, request: Request) -> None:
        """Forget a request and free its slots at once (finished, aborted, failed, timed out)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        for slot in request.strategy.release_slots():
            self.pool.free(slot)
