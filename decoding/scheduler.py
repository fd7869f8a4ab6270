"""Who runs next: FIFO admission while KV slots allow, and a per-step token budget.

Decode rows always get their one token; what is left of ``max_num_batched_tokens`` goes to prompt
chunks in arrival order, so a long prompt is prefilled over several steps instead of stalling the
streams already running (chunked prefill, as in vLLM and TGI).
"""

from __future__ import annotations

from collections import deque

from decoding.kv_cache import KVPool
from decoding.request import Request, RequestState


class Scheduler:
    def __init__(self, pool: KVPool, max_num_batched_tokens: int) -> None:
        self.pool = pool
        self.max_num_batched_tokens = max_num_batched_tokens
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
        """Move waiting requests to running, first come first served, while their rows fit."""
        admitted = []
        while self.waiting and self.pool.num_free >= self.waiting[0].num_slots:
            request = self.waiting.popleft()
            request.assign_slots([self.pool.allocate() for _ in range(request.num_slots)])
            request.state = RequestState.RUNNING
            self.running.append(request)
            admitted.append(request)
        return admitted

    def prefill_budget(self, num_decode_rows: int) -> int:
        return max(self.max_num_batched_tokens - num_decode_rows, 0)

    def remove(self, request: Request) -> None:
        """Forget a request and free its slots at once (finished, aborted, failed, timed out)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        for slot in request.release_slots():
            self.pool.free(slot)
        request.state = RequestState.FINISHED
