"""Who runs next: FIFO admission while KV blocks allow, preemption when they run out, a token budget.

Admission takes a request when a row handle per row and the blocks of its whole prompt (less
what the prefix cache already holds) are free, keeping a reserve for the running rows to grow
into. When a step's rows still need more blocks than are free, the newest running request is
preempted: its blocks are copied out of the pool (``KVPool.swap_out``) and it waits, ahead of
every new request, until they fit again; its strategy state is untouched, so it resumes exactly
where it stopped and its output is the same as if it had never paused.

Decode rows always get their tokens; what is left of ``max_num_batched_tokens`` goes to prompt
chunks in arrival order, so a long prompt is prefilled over several steps instead of stalling the
streams already running (chunked prefill, as in vLLM and TGI). Rows that feed many tokens a step
(contrastive candidates, drafts) could leave nothing for prompts, so prompts always keep a floor
of the budget: an admitted request's prefill always makes progress.
"""

from __future__ import annotations

from collections import deque

from decoding.kv.pool import KVPool, SwappedRow
from decoding.model.runner import RowInput
from decoding.strategies import DecodingStrategy
from decoding.telemetry import EngineObserver

PREFILL_FLOOR_FRACTION = 0.25  # share of max_num_batched_tokens that prompt chunks always get
RESERVE_FRACTION = 0.01  # blocks admission leaves free for running rows to grow into (vLLM's watermark)


class Scheduler:
    def __init__(self, pool: KVPool, max_num_batched_tokens: int, observer: EngineObserver | None = None) -> None:
        self.pool = pool
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_floor = max(1, int(max_num_batched_tokens * PREFILL_FLOOR_FRACTION))
        self.reserve = max(1, int(pool.blocks.num_blocks * RESERVE_FRACTION))
        self.observer = observer or EngineObserver()
        # each request is held as its strategy (which holds the request): the slots are the strategy's
        self.waiting: deque[DecodingStrategy] = deque()
        self.running: list[DecodingStrategy] = []
        self.preempted: deque[DecodingStrategy] = deque()  # oldest first; they resume before anyone new
        self._swapped: dict[int, dict[int, SwappedRow]] = {}  # id(strategy) -> slot -> its K/V

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.preempted)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.preempted)

    def add(self, strategy: DecodingStrategy) -> None:
        self.waiting.append(strategy)

    def admit(self) -> list[DecodingStrategy]:
        """Resume preempted requests, then admit waiting ones first come first served, while they fit."""
        while self.preempted and self._resume(self.preempted[0]):
            self.preempted.popleft()
        admitted = []
        while not self.preempted and self.waiting and self._start(self.waiting[0]):
            strategy = self.waiting.popleft()
            self.running.append(strategy)
            admitted.append(strategy)
        return admitted

    def _start(self, strategy: DecodingStrategy) -> bool:
        """Give a request its rows and its prompt's blocks (cached ones shared), or leave it waiting."""
        request, pool = strategy.request, self.pool
        if pool.num_free < strategy.num_slots:
            return False
        strategy.assign_slots([pool.allocate() for _ in range(strategy.num_slots)])
        slot, prompt = strategy.prefill_slot, request.prompt_ids
        cached = 0
        if strategy.reuses_prefix:  # at least the last prompt token is computed: its logits start decoding
            cached = pool.attach_prefix(slot, prompt, len(prompt) - 1)
        needed = pool.blocks_for(len(prompt)) - len(pool.tables[slot]) + max(self.reserve, strategy.num_slots)
        if pool.blocks.num_free < needed:
            for held in strategy.release_slots():
                pool.free(held)
            return False
        pool.prepare(slot, cached, len(prompt))
        request.num_prefilled = cached
        request.num_cached_tokens = cached
        if strategy.reuses_prefix:
            self.observer.on_prefix_cache(len(prompt), cached)
        return True

    def make_room(self, rows: list[tuple[DecodingStrategy, RowInput]]) -> DecodingStrategy | None:
        """Preempt the newest running requests until the rows of this step (``(strategy, row)``)
        have every block they write; returns a request that cannot fit even alone."""
        pool = self.pool
        while True:
            live = [(strategy, row) for strategy, row in rows if strategy in self.running]
            needed = sum(pool.blocks_needed(row.slot, row.start, row.start + len(row.token_ids)) for _, row in live)
            if needed <= pool.blocks.num_free:
                return None
            if len(self.running) == 1:
                return self.running[0]
            self.preempt(self.running[-1])

    def preempt(self, strategy: DecodingStrategy) -> None:
        """Take a request's K/V out of the pool; it waits, first in line, to resume."""
        self.running.remove(strategy)
        self._swapped[id(strategy)] = {slot: self.pool.swap_out(slot) for slot in strategy.held_slots()}
        self.preempted.append(strategy)
        self.observer.on_preempted()

    def _resume(self, strategy: DecodingStrategy) -> bool:
        swapped = self._swapped[id(strategy)]
        if self.pool.blocks.num_free < sum(row.num_blocks for row in swapped.values()) + self.reserve:
            return False
        for slot, row in swapped.items():
            self.pool.swap_in(slot, row)
        del self._swapped[id(strategy)]
        self.running.append(strategy)
        self.running.sort(key=lambda s: s.request.arrival_time)  # prefill order stays first come first served
        return True

    def prefill_budget(self, num_decode_tokens: int) -> int:
        """Prompt tokens this step may carry after the decode rows' ``num_decode_tokens``."""
        return max(self.max_num_batched_tokens - num_decode_tokens, self.prefill_floor)

    def remove(self, strategy: DecodingStrategy) -> None:
        """Forget a request and free its rows at once (finished, aborted, failed, timed out); the
        full blocks of what it computed stay in the prefix cache for later requests."""
        if strategy in self.running:
            self.running.remove(strategy)
        elif strategy in self.waiting:
            self.waiting.remove(strategy)
        elif strategy in self.preempted:
            self.preempted.remove(strategy)
            self._swapped.pop(id(strategy), None)
        if strategy.request.error is None:
            for slot, token_ids in strategy.cached_sequences():
                self.pool.register(slot, token_ids)
        for slot in strategy.release_slots():
            self.pool.free(slot)
