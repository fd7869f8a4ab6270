"""Who runs next: admission while rows and KV blocks allow, preemption when they run out, a token budget.

The order is ``policy``'s: priority, then a weighted fair share between callers, then arrival (with one
caller and one priority: first come first served). Admission takes the head of that order when its
rows fit under ``max_rows`` (``--max-num-seqs``) and the blocks of its whole prompt (less what the
prefix cache already holds) are free, keeping a reserve for the running rows to grow into. When the
head does not fit, a running request of lower priority, or of a caller over its share, gives way to
it (``policy.victim_for``); when a step's rows need more blocks than are free, the least entitled
running request gives way (``policy.least_entitled``).

A request that gives way is preempted: its blocks are copied out of the pool (``KVPool.swap_out``),
each block its rows share once, and it waits, ahead of its caller's new requests, until they fit
again; its strategy state and its row handles are untouched, so it resumes exactly where it stopped
and its output is the same as if it had never paused. Keeping the sharing keeps the copy (host memory
outside ``--kv-cache-memory``) and what it needs to resume to what it held, so a request that ran can
always resume once it is alone. The pool has twice ``max_rows`` row handles (``limits.kv_pool_for``):
the running rows, and as many again held by preempted requests; when preempted requests hold every
free handle, one of them resumes before anything new starts.

A request that cannot fit even with the pool to itself (more rows than ``max_rows``, more blocks than
the pool) never will: ``admit`` hands it back as unfit (the engine fails it with its id) instead of
leaving the queue stuck behind it, or anyone giving way to it.

Decode rows always get their tokens; what is left of ``max_num_batched_tokens`` goes to prompt
chunks in the running order (priority, then arrival), so a long prompt is prefilled over several steps
instead of stalling the streams already running (chunked prefill, as in vLLM and TGI). Rows that feed
many tokens a step (contrastive candidates, drafts) could leave nothing for prompts, so prompts always
keep a floor of the budget: an admitted request's prefill always makes progress. While a prompt is
being fed, the running requests of a lower priority sit those steps out (``stepping``): a request of
higher priority gets its first token after a step as short as on an idle server, not after one carrying
the whole batch's decode rows. With ``--max-prefill-share`` below 1, prompt work takes at most that share of
the time while rows decode (``prefill_share``): beyond it a step carries only a trickle of prompt tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from decoding.engine.cross_slots import cross_blocks, handles_needed, has_encoder
from decoding.engine.cross_slots import held as held_cross_slot
from decoding.engine.cross_slots import hold as hold_cross_slot
from decoding.engine.cross_slots import let_go as let_go_cross_slot
from decoding.engine.policy import (
    Shares,
    WaitingLine,
    caller_of,
    least_entitled,
    priority_of,
    run_order,
    victim_for,
)
from decoding.engine.prefill_share import PrefillShare
from decoding.engine.step_shares import StepShares
from decoding.engine.vision_stage import row_media
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
        loras: LoraResidency | None = None, max_rows: int | None = None, weights: Mapping[str, float] | None = None,
        prefill_share: float = 1.0, fair_share: str = "rows",
    ) -> None:  # fmt: skip
        """``loras``: the LoRA adapters; a request with one is admitted once its adapter is resident.
        ``max_rows``: rows running at once (``--max-num-seqs``; default: every row handle of the pool);
        ``weights``: caller -> its weight in the fair share (1 when absent); ``prefill_share``: the most of
        the time prompt work takes while rows decode (``--max-prefill-share``, ``prefill_share.py``); ``fair_share``:
        ``steps`` shares each step's rows between callers too (``--fair-share``, ``step_shares.py``)."""
        self.pool = pool
        self.loras = loras
        self._adapter_slot: dict[int, int] = {}  # id(strategy) -> the bank slot its adapter holds
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_floor = max(1, int(max_num_batched_tokens * PREFILL_FLOOR_FRACTION))
        self.prefill_share = PrefillShare(prefill_share)
        self.reserve = reserve_blocks(pool.blocks.num_blocks)
        self.max_rows = max_rows or pool.num_slots
        self.observer = observer or EngineObserver()
        self.shares = Shares(weights)
        self.step_shares = StepShares(self.shares, fair_share)
        # each request is held as its strategy (which holds the request): the slots are the strategy's
        self.waiting = WaitingLine(self.shares)  # new and preempted requests, in the policy's order
        self.running: list[DecodingStrategy] = []  # in run_order: priority, then arrival
        self.held: Counter[str] = Counter()  # caller -> rows its running requests hold
        self.num_running_rows = 0
        self._swapped: dict[int, SwappedRows] = {}  # id(strategy) -> its K/V while preempted

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def preempted(self) -> list[DecodingStrategy]:
        """The waiting requests that ran and gave way."""
        return self.waiting.preempted()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, strategy: DecodingStrategy) -> None:
        self.waiting.add(strategy)

    def next_deadline(self) -> float | None:
        """The soonest ``time.monotonic()`` at which a time limit ends one of the requests, if any has one."""
        deadlines = [s.request.deadline() for s in (*self.running, *self.waiting)]
        return min((d for d in deadlines if d is not None), default=None)

    def admit(self) -> tuple[list[DecodingStrategy], list[tuple[DecodingStrategy, str]]]:
        """Admit (or resume) requests in the policy's order while they fit, running ones giving way to
        those that outrank them.

        Returns the newly admitted requests, and the ones that cannot fit even with the pool to
        themselves, with why: they are out of every queue, their rows freed; the caller fails them.
        """
        admitted: list[DecodingStrategy] = []
        unfit: list[tuple[DecodingStrategy, str]] = []
        while (strategy := self.waiting.head(self.held)) is not None:
            if not self._resuming(strategy) and self.pool.num_free < handles_needed(strategy):
                # preempted requests hold every free row handle: the next of them resumes first
                strategy = self.waiting.head(self.held, preempted_only=True) or strategy
            never = self._never_fits(strategy)
            if never is None and (self._place(strategy) or self._make_way(strategy)):
                if not self._resuming(strategy):
                    admitted.append(strategy)
                self._swapped.pop(id(strategy), None)
                self.waiting.remove(strategy)
                self._run(strategy)
                continue
            if self.running and never is None:
                break
            unfit.append((strategy, never or self._too_big(self._blocks_needed(strategy), strategy)))
            self.remove(strategy)
        self._report_adapters()
        return admitted, unfit

    def admit_outranking(self, floor: int) -> list[DecodingStrategy]:
        """Start the new waiting requests of a priority below ``floor`` that fit now with nobody giving way
        (a step is under way: its rows keep their slots and blocks), in the policy's order."""
        new = [strategy for strategy in self.waiting if not self._resuming(strategy)]
        outranking = sorted((strategy for strategy in new if priority_of(strategy) < floor), key=run_order)
        admitted = []
        for strategy in outranking:
            if self._never_fits(strategy) is None and self._place(strategy):
                self.waiting.remove(strategy)
                self._run(strategy)
                admitted.append(strategy)
        self._report_adapters()
        return admitted

    def _resuming(self, strategy: DecodingStrategy) -> bool:
        return id(strategy) in self._swapped

    def _blocks_needed(self, strategy: DecodingStrategy) -> int:
        """Blocks the request needs to run with the pool to itself."""
        if self._resuming(strategy):
            return self._swapped[id(strategy)].num_blocks
        prompt_blocks = self.pool.blocks_for(len(strategy.request.prompt_ids)) + cross_blocks(self.pool, strategy)
        return admission_blocks(prompt_blocks, strategy.num_slots, self.pool.blocks.num_blocks)

    def _never_fits(self, strategy: DecodingStrategy) -> str | None:
        """Why the request cannot run even alone (None: it can)."""
        blocks = self._blocks_needed(strategy)
        if strategy.num_slots > self.max_rows or blocks > self.pool.blocks.num_blocks:
            return self._too_big(blocks, strategy)
        return None

    def _place(self, strategy: DecodingStrategy) -> bool:
        """Resume a preempted request or start a new one, if its rows and blocks fit now."""
        if self.num_running_rows + strategy.num_slots > self.max_rows:
            return False
        return self._resume(strategy) if self._resuming(strategy) else self._start(strategy)

    def _make_way(self, strategy: DecodingStrategy) -> bool:
        """Preempt running requests that give way to ``strategy`` (``policy.victim_for``) until it fits."""
        new = not self._resuming(strategy)
        if new and (self.pool.num_free < handles_needed(strategy) or not self._adapter_free(strategy)):
            return False  # giving way frees no row handle nor adapter bank slot: preempted requests keep theirs
        while (victim := victim_for(strategy, self.running, self.held, self.shares)) is not None:
            self.preempt(victim)
            if self._place(strategy):
                return True
        return False

    def _run(self, strategy: DecodingStrategy) -> None:
        self.running.append(strategy)
        self.running.sort(key=run_order)  # prompt chunks are fed in this order
        self.held[caller_of(strategy)] += strategy.num_slots
        self.num_running_rows += strategy.num_slots

    def _stop_running(self, strategy: DecodingStrategy) -> None:
        self.running.remove(strategy)
        self.held[caller_of(strategy)] -= strategy.num_slots
        if self.held[caller_of(strategy)] <= 0:
            del self.held[caller_of(strategy)]
        self.num_running_rows -= strategy.num_slots

    def _too_big(self, blocks: int, strategy: DecodingStrategy) -> str:
        return (
            f"the KV cache ({self.pool.blocks.num_blocks} blocks of {self.pool.block_size} tokens, "
            f"{self.max_rows} rows) cannot hold this request even alone (it needs {blocks} blocks "
            f"and {strategy.num_slots} rows); raise --kv-cache-memory or --max-num-seqs"
        )

    def _start(self, strategy: DecodingStrategy) -> bool:
        """Give a request its rows and its prompt's blocks (cached ones shared), or leave it waiting."""
        request, pool = strategy.request, self.pool
        if pool.num_free < handles_needed(strategy):
            return False
        adapter = self._take_adapter(strategy)
        if adapter is None:  # its adapter needs a bank slot, and running requests hold every one
            return False
        strategy.assign_slots([pool.allocate() for _ in range(strategy.num_slots)])
        self._bind_adapter(strategy, adapter)
        media = row_media(request, pool.keys[0].device)  # a prompt with images: its cache keys, M-RoPE, spans
        for held in strategy.held_slots() if media is not None else ():
            pool.media[held] = media
        slot, prompt = strategy.prefill_slot, request.prompt_ids
        cached = 0
        reuses = strategy.reuses_prefix and not has_encoder(strategy)  # cross_slots: why not an encoder's
        if reuses:  # at least the last prompt token is computed: its logits start decoding
            cached = pool.attach_prefix(slot, prompt, len(prompt) - 1)
        needed = admission_blocks(pool.blocks_for(len(prompt)) - len(pool.tables[slot]) + cross_blocks(pool, strategy),
                                  strategy.num_slots, pool.blocks.num_blocks)  # fmt: skip
        if pool.blocks.num_free < needed:
            for held in strategy.release_slots():
                pool.free(held)
            self._let_go_adapter(strategy)
            return False
        hold_cross_slot(pool, strategy)
        pool.prepare(slot, cached, len(prompt))
        request.num_prefilled = cached
        request.num_cached_tokens = cached
        if reuses:
            self.observer.on_prefix_cache(len(prompt), cached)
        return True

    def make_room(self, rows: list[tuple[DecodingStrategy, RowInput]]) -> tuple[DecodingStrategy, str] | None:
        """Preempt the least entitled running requests until the rows of this step (``(strategy, row)``)
        have every block they write; returns a request that cannot fit even alone, and why."""
        pool = self.pool
        self.step_shares.fed([strategy for strategy, _ in rows])
        while True:
            live = [(strategy, row) for strategy, row in rows if strategy in self.running]
            needed = sum(pool.blocks_needed(row.slot, row.start, row.start + len(row.token_ids)) for _, row in live)
            if needed <= pool.blocks.num_free:
                return None
            if len(self.running) == 1:
                alone = self.running[0]
                return alone, self._too_big(pool.blocks.num_used + needed, alone)
            self.preempt(least_entitled(self.running, self.held, self.shares))

    def preempt(self, strategy: DecodingStrategy) -> None:
        """Take a request's K/V out of the pool; it waits, ahead of its caller's new requests, to resume."""
        self._stop_running(strategy)
        self._swapped[id(strategy)] = self.pool.swap_out(strategy.held_slots() + held_cross_slot(strategy))
        self.waiting.add(strategy, preempted=True)
        self.observer.on_preempted()

    def swapped_blocks(self, strategy: DecodingStrategy) -> int:
        """Blocks a preempted request needs to resume (what it held when preempted)."""
        return self._swapped[id(strategy)].num_blocks

    def _resume(self, strategy: DecodingStrategy) -> bool:
        """Put a preempted request's K/V back, keeping the reserve free unless nothing else runs."""
        swapped = self._swapped[id(strategy)]
        reserve = self.reserve if self.running else 0
        if self.pool.blocks.num_free < swapped.num_blocks + reserve:
            return False
        self.pool.swap_in(swapped)
        return True

    def stepping(self) -> list[DecodingStrategy]:
        """The running requests whose rows feed this step: while a request's prompt is being fed, those of
        a lower priority (a higher number) sit the step out, so a prompt of higher priority is prefilled in a
        step of its own standing and its first token does not wait on the whole batch's decode rows. Their
        state is untouched: they go on at the next step. With one priority, every running request; with
        ``--fair-share steps``, only each caller's part of them (``step_shares.py``)."""
        prefilling = [priority_of(s) for s in self.running if not s.request.prefill_done]
        if not prefilling:
            return self.step_shares.select(self.running)
        top = min(prefilling)
        return self.step_shares.select([strategy for strategy in self.running if priority_of(strategy) <= top])

    def prefill_budget(self, num_decode_tokens: int) -> int:
        """Prompt tokens this step may carry after the decode rows' ``num_decode_tokens``: what the token
        budget leaves, or a trickle (as many as the decode tokens) while prompt work is over its share."""
        budget = max(self.max_num_batched_tokens - num_decode_tokens, self.prefill_floor)
        if self.prefill_share.limited(num_decode_tokens):
            return min(budget, num_decode_tokens)
        return budget

    def holds_back_images(self, num_decode_tokens: int) -> bool:
        """Whether this step's prompt chunks stop before images not yet through the vision tower (prompt
        work is over its share: a tower call is the largest lump a step can carry)."""
        return self.prefill_share.limited(num_decode_tokens)

    def remove(self, strategy: DecodingStrategy) -> None:
        """Forget a request and free its rows at once (finished, aborted, failed, timed out); the
        full blocks of what it computed stay in the prefix cache for later requests."""
        self.step_shares.forget(strategy)
        if strategy in self.running:
            self._stop_running(strategy)
        elif self.waiting.remove(strategy):
            self._swapped.pop(id(strategy), None)
        if strategy.request.error is None and not has_encoder(strategy):
            for slot, token_ids in strategy.cached_sequences():
                self.pool.register(slot, token_ids)
        let_go_cross_slot(self.pool, strategy)
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

    def _adapter_free(self, strategy: DecodingStrategy) -> bool:
        """Whether the request's adapter (if any) can have a bank slot now."""
        name = strategy.request.params.lora_name
        if name is None or self.loras is None:
            return True
        slot = self.loras.acquire(name)
        if slot is None:
            return False
        self.loras.release(slot)
        return True

    def _let_go_adapter(self, strategy: DecodingStrategy) -> None:
        adapter = self._adapter_slot.pop(id(strategy), None)
        if adapter is not None and self.loras is not None:
            self.loras.release(adapter)

    def _report_adapters(self) -> None:
        if self.loras is None:
            return
        waiting = {s.request.params.lora_name for s in self.waiting} - {None}
        self.observer.on_lora_requests(self.loras.running_names(), sorted(waiting), self.loras.max_loras)
