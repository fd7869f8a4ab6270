"""The urgent lane: a request that outranks every row of the step under way does not wait for the step.

On a CPU one step of 32 decoding rows takes a quarter of a second or more, and a request that arrived
just after it began waited for all of it before its prompt was even read: a priority-0 client's first
token took three times as long beside 32 priority-10 streams as on an idle server, most of it spent
waiting for a step that was already under way (the step after it already runs the urgent prompt alone:
``Scheduler.stepping``).

So, once a request with a priority other than 0 has been seen (priorities are in use), the step's forward
asks before each decoder layer whether a request of a better priority than all of its rows arrived
(``ModelRunner.forward``'s ``interrupt``). When one did, the forward stops between two layers; the
worker hands over the new requests in its inbox (every other command waits for the step's end); those
that outrank the step and fit with nobody giving way are started and their prompts run in forwards of
their own, to their first token; then the interrupted forward runs again from its start, exactly as it
was planned: its rows' slots, blocks and lengths were never touched, and the K/V it had written lie
beyond every committed length, where the second run writes the same values. The price is the part of
the forward that ran before the stop, once per urgent arrival; nothing changes a token.

Never interrupted: a compiled forward or a replayed graph (a hook would force it eager), an
encoder-decoder model's steps (its encoder runs at admission, inside the step), and every step of a
server that has only seen priority 0 (no hook is even installed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from decoding.engine import prefill
from decoding.engine.forward_stage import Fed
from decoding.engine.policy import priority_of
from decoding.engine.scheduler import Scheduler
from decoding.strategies import DecodingStrategy
from decoding.telemetry import EngineObserver


class UrgentLane:
    def __init__(self, scheduler: Scheduler, run_prompts: Callable[[list[DecodingStrategy]], None],
                 observer: Callable[[], EngineObserver], allowed: bool = True) -> None:  # fmt: skip
        """``run_prompts``: the engine's forwards of the given requests' prompt chunks alone (consumed, sampled
        and streamed as a step's); ``allowed``: False for an engine whose steps must not be interrupted."""
        self.scheduler = scheduler
        self.run_prompts = run_prompts
        self.observer = observer
        self.allowed = allowed
        self.in_use = False  # a request with a priority other than 0 arrived: forwards take the hook from now on
        # the worker's: hand the submits in its inbox to the engine now (set by the worker that steps the engine)
        self.take_commands: Callable[[], None] = lambda: None
        self._floor: int | None = None  # the best priority among the rows of the forward under way
        self._pending = threading.Event()

    def see(self, priority: int) -> None:
        """A request joined the engine (worker thread)."""
        if priority != 0 and self.allowed:
            self.in_use = True

    def offer(self, priority: int) -> None:
        """A request was put in the worker's inbox (any thread): stop the forward under way if it outranks it.
        A forward that starts after this reads the flag at its first layer: an arrival between two forwards
        costs at most an empty check."""
        floor = self._floor
        if floor is not None and priority < floor:
            self._pending.set()

    def arm(self, batch: list[Fed]) -> UrgentLane | None:
        """This lane for the step's forward of ``batch`` while priorities are in use, else None (no hook)."""
        if not self.in_use or not batch:
            return None
        self._floor = min(priority_of(fed.strategy) for fed in batch)
        return self

    def interrupts(self) -> bool:
        """Asked before every decoder layer of the armed forward."""
        if not self._pending.is_set():
            return False
        self._pending.clear()
        return True

    def serve(self) -> None:
        """Between two layers of the interrupted forward: the outranking requests started and prefilled."""
        self.take_commands()
        floor = self._floor
        if floor is None:
            return
        admitted = self.scheduler.admit_outranking(floor)
        now = time.monotonic()
        for strategy in admitted:
            request = strategy.request
            request.start_time = now
            self.observer().on_admitted(strategy.name, now - request.arrival_time, len(request.prompt_ids))
        if admitted:
            self.run_prompts(admitted)


def prompt_chunks(strategies: list[DecodingStrategy], scheduler: Scheduler) -> list[Fed]:
    """The next prompt chunk of each of ``strategies`` still prefilling, within the token budget; none when
    their blocks do not fit in what is free (the lane never takes blocks by preempting: a step is under way)."""
    budget, pool = scheduler.max_num_batched_tokens, scheduler.pool
    batch = []
    for strategy in strategies:
        request = strategy.request
        if request.prefill_done or request.error is not None or strategy not in scheduler.running or budget <= 0:
            continue
        chunk = prefill.next_chunk(strategy, budget)
        batch.append(Fed(strategy, chunk, True))
        budget -= len(chunk.token_ids)
    needed = sum(pool.blocks_needed(f.row_input.slot, f.row_input.start, f.row_input.start + len(f.row_input.token_ids))
                 for f in batch)  # fmt: skip
    return batch if needed <= pool.blocks.num_free else []
