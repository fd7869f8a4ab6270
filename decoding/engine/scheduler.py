"""Who runs next: FIFO admission while KV blocks allow, preemption when they run out, a token budget.

Admission takes a request when a row handle per row and the blocks of its whole prompt (less
what the prefix cache already holds) are free, keeping a reserve for the running rows to grow
into. When a step's rows still need more blocks than are free, the newest running request is
preempted: its blocks are copied out of the pool (``KVPool.swap_out``), each block its rows share
once, and it waits, ahead of every new request, until they fit again; its strategy state is
untouched, so it resumes exactly where it stopped and its output is the same as if it had never
paused. Keeping the sharing keeps the copy (host memory outside ``--kv-cache-memory``) and what it
needs to resume to what it held, so a request that ran can always resume once it is alone.

A request at the head of the line when nothing runs can only fit if the whole pool is enough for
it; when it is not, it never will be: ``admit`` hands it back as unfit (the engine fails it with
its id) instead of leaving the queue stuck behind it.

Decode rows always get their tokens; what is left of ``max_num_batched_tokens`` goes to prompt
chunks in arrival order, so a long prompt is prefilled over several steps instead of stalling the
streams already running (chunked prefill, as in vLLM and TGI). Rows that feed many tokens a step
(contrastive candidates, drafts) could leave nothing for prompts, so prompts always keep a floor
of the budget: an admitted request's prefill always makes progress.
"""

from __future__ import annotations

from collections import deque

from decoding.kv.blocks import adapter_root
from decoding.kv.pool import KVPool, SwappedRows
from decoding.model.lora import LoraResidency
from decoding.model.runner import RowInput
from decoding.strategies import DecodingStrategy
from decoding.telemetry import EngineObserver

PREFILL_FLOOR_FRACTION = 0.25  # share of max_num_batched_tokens that prompt chunks always get
RESERVE_FRACTION = 0.01  # blocks admission leaves free for running rows to grow into (vLLM's watermark)


def reserve_blocks(num_blocks: int) -> int:
    """Blocks admission keeps free in a pool of ``num_blocks`` for the running rows to grow into."""
    return max(1, int(num_blocks * RESERVE_FRACTION))


def admission_blocks(prompt_blocks: int, num_rows: int, num_blocks: int) -> int:
    """Free blocks admitting a request takes: its prompt's (less what the prefix cache holds), and the
    reserve or a block per row (each row's first token may copy the prompt's shared last block),
    whichever is more. The start-up check (``limits.kv_pool_for``) asks it of the widest request."""
    return prompt_blocks + max(reserve_blocks(num_blocks), num_rows)


class Scheduler:
    def __init__(
        self, pool: KVPool, max_num_batched_tokens: int, observer: EngineObserver | None = None,
        loras: LoraResidency | None = None,
    ) -> None:  # fmt: skip
        """``loras``: the LoRA adapters; a request with one is admitted once its adapter is resident."""
        self.pool = pool
        self.loras = loras
        self._adapter_slot: dict[int, int] = {}  # id(strategy) -> the bank slot its adapter holds
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_floor = max(1, int(max_num_batched_tokens * PREFILL_FLOOR_FRACTION))
        self.reserve = reserve_blocks(pool.blocks.num_blocks)
        self.observer = observer or EngineObserver()
        # each request is held as its strategy (which holds the request): the slots are the strategy's
        self.waiting: deque[DecodingStrategy] = deque()
        self.running: list[DecodingStrategy] = []
        self.preempted: deque[DecodingStrategy] = deque()  # oldest first; they resume before anyone new
        self._swapped: dict[int, SwappedRows] = {}  # id(strategy) -> its K/V while preempted

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

    def next_deadline(self) -> float | None:
        """The soonest ``time.monotonic()`` at which a time limit ends one of the requests, if any has one."""
        deadlines = [s.request.deadline() for s in (*self.running, *self.preempted, *self.waiting)]
        return min((d for d in deadlines if d is not None), default=None)

    def admit(self) -> tuple[list[DecodingStrategy], list[tuple[DecodingStrategy, str]]]:
        """Resume preempted requests, then admit waiting ones first come first served, while they fit.

        Returns the admitted requests, and the ones that cannot fit even with the pool to themselves,
        with why: they are out of every queue, their rows freed; the caller fails them.
        """
        admitted: list[DecodingStrategy] = []
        unfit: list[tuple[DecodingStrategy, str]] = []
        while self.preempted:
            strategy = self.preempted[0]
            if self._resume(strategy):
                self.preempted.popleft()
            elif self.running:
                break
            else:  # alone, and the whole pool is not enough: it never will be
                unfit.append((strategy, self._too_big(self._swapped[id(strategy)].num_blocks, strategy)))
                self.remove(strategy)
        while not self.preempted and self.waiting:
            strategy = self.waiting[0]
            if self._start(strategy):
                self.running.append(self.waiting.popleft())
                admitted.append(strategy)
            elif self.running:
                break
            else:
                prompt_blocks = self.pool.blocks_for(len(strategy.request.prompt_ids))
                needed = admission_blocks(prompt_blocks, strategy.num_slots, self.pool.blocks.num_blocks)
                unfit.append((strategy, self._too_big(needed, strategy)))
                self.remove(strategy)
        self._report_adapters()
        return admitted, unfit

    def _too_big(self, blocks: int, strategy: DecodingStrategy) -> str:
        return (
            f"the KV cache ({self.pool.blocks.num_blocks} blocks of {self.pool.block_size} tokens, "
            f"{self.pool.num_slots} rows) cannot hold this request even alone (it needs {blocks} blocks "
            f"and {strategy.num_slots} rows); raise --kv-cache-memory or --max-num-seqs"
        )

    def _start(self, strategy: DecodingStrategy) -> bool:
        """Give a request its rows and its prompt's blocks (cached ones shared), or leave it waiting."""
        request, pool = strategy.request, self.pool
        if pool.num_free < strategy.num_slots:
            return False
        adapter = self._take_adapter(strategy)
        if adapter is None:  # its adapter needs a bank slot, and running requests hold every one
            return False
        strategy.assign_slots([pool.allocate() for _ in range(strategy.num_slots)])
        self._bind_adapter(strategy, adapter)
        slot, prompt = strategy.prefill_slot, request.prompt_ids
        cached = 0
        if strategy.reuses_prefix:  # at least the last prompt token is computed: its logits start decoding
            cached = pool.attach_prefix(slot, prompt, len(prompt) - 1)
        needed = admission_blocks(pool.blocks_for(len(prompt)) - len(pool.tables[slot]), strategy.num_slots,
                                  pool.blocks.num_blocks)  # fmt: skip
        if pool.blocks.num_free < needed:
            for held in strategy.release_slots():
                pool.free(held)
            self._let_go_adapter(strategy)
            return False
        pool.prepare(slot, cached, len(prompt))
        request.num_prefilled = cached
        request.num_cached_tokens = cached
        if strategy.reuses_prefix:
            self.observer.on_prefix_cache(len(prompt), cached)
        return True

    def make_room(self, rows: list[tuple[DecodingStrategy, RowInput]]) -> tuple[DecodingStrategy, str] | None:
        """Preempt the newest running requests until the rows of this step (``(strategy, row)``)
        have every block they write; returns a request that cannot fit even alone, and why."""
        pool = self.pool
        while True:
            live = [(strategy, row) for strategy, row in rows if strategy in self.running]
            needed = sum(pool.blocks_needed(row.slot, row.start, row.start + len(row.token_ids)) for _, row in live)
            if needed <= pool.blocks.num_free:
                return None
            if len(self.running) == 1:
                alone = self.running[0]
                return alone, self._too_big(pool.blocks.num_used + needed, alone)
            self.preempt(self.running[-1])

    def preempt(self, strategy: DecodingStrategy) -> None:
        """Take a request's K/V out of the pool; it waits, first in line, to resume."""
        self.running.remove(strategy)
        self._swapped[id(strategy)] = self.pool.swap_out(strategy.held_slots())
        self.preempted.append(strategy)
        self.observer.on_preempted()

    def swapped_blocks(self, strategy: DecodingStrategy) -> int:
        """Blocks a preempted request needs to resume (what it held when preempted)."""
        return self._swapped[id(strategy)].num_blocks

    def _resume(self, strategy: DecodingStrategy) -> bool:
        """Put a preempted request back, keeping the reserve free unless nothing else runs."""
        swapped = self._swapped[id(strategy)]
        reserve = self.reserve if self.running else 0
        if self.pool.blocks.num_free < swapped.num_blocks + reserve:
            return False
        self.pool.swap_in(swapped)
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
        self._let_go_adapter(strategy)

    # ---- LoRA adapters ---------------------------------------------------------------------------------
    def _take_adapter(self, strategy: DecodingStrategy) -> int | None:
        """The bank slot of the request's adapter (0: none), or None while no slot can hold it."""
        name = strategy.request.params.lora_name
        if name is None or self.loras is None:
            return 0
        return self.loras.acquire(name)

    def _bind_adapter(self, strategy: DecodingStrategy, adapter: int) -> None:
        """Every row of the request runs its adapter; its prefix blocks are keyed under the adapter."""
        if self.loras is None:
            return
        held = strategy.held_slots()
        self.loras.bind(held, adapter)  # a base request's rows too: a row handle may have served an adapter
        if adapter == 0:
            return
        self._adapter_slot[id(strategy)] = adapter
        root = adapter_root(self.loras.uids[strategy.request.params.lora_name])
        for slot in held:
            self.pool.set_root(slot, root)

    def _let_go_adapter(self, strategy: DecodingStrategy) -> None:
        adapter = self._adapter_slot.pop(id(strategy), None)
        if adapter is not None and self.loras is not None:
            self.loras.release(adapter)

    def _report_adapters(self) -> None:
        if self.loras is None:
            return
        waiting = {s.request.params.lora_name for s in (*self.waiting, *self.preempted)} - {None}
        self.observer.on_lora_requests(self.loras.running_names(), sorted(waiting), self.loras.max_loras)
