"""Who runs first and who gives way: priority, then a weighted fair share between callers, then arrival.

Each request carries a ``priority`` (lower runs first, as vLLM's ``priority``) and a ``caller`` (the
server names it: the API key, else the end user the body names; "" when neither, one shared line).
Waiting requests stand in one line per (priority, caller): the caller's preempted requests first
(oldest first: they already ran), then its new ones in arrival order.

The next request admitted is the head of the best line: the lowest priority number that has waiting
requests; among that level's callers, the one holding the fewest running rows per unit of weight
(``--caller-weights``, 1 by default), ties to the earliest head. That is weighted round robin with the
round measured in rows held: every backlogged caller holds a share of the batch proportional to its
weight, so a caller sending 4 requests beside another's burst of 64 is served at the next free row,
not after the burst; and a caller back from a pause is served at once (no credit is saved up while
idle, so none can be spent on a burst later). Counting rows rather than requests is what
``--max-concurrency-per-key`` counts too: a request with ``n`` 8 holds 8. With one caller and one
priority the order is first come first served, preempted requests first, exactly as before.

When the head cannot fit (its rows would pass ``--max-num-seqs``, or too few KV blocks are free), a
running request gives way (is preempted: its K/V swapped out, it resumes token for token later):

- one of strictly lower priority: the highest number, the newest of those (vLLM's priority policy);
- else, at the same priority, one of another caller whose share stays at least the head's caller's
  after the move: ``(held - rows) / weight >= (held' + rows') / weight'``. Once that caller has given
  way the inequality cannot hold the other way round, so two callers never take turns preempting
  each other, and nobody gives way to a request of equal standing.

When a step's rows need more KV blocks than are free (``Scheduler.make_room``), the request that gives
way is the least entitled: the lowest priority, then the caller most over its share, then the newest
(with one caller and one priority: the newest, as before).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from decoding.strategies import DecodingStrategy


def priority_of(strategy: DecodingStrategy) -> int:
    return strategy.request.params.priority


def caller_of(strategy: DecodingStrategy) -> str:
    return strategy.request.params.caller


def run_order(strategy: DecodingStrategy) -> tuple[int, float]:
    """The running batch's order, which prompt chunks follow: priority, then arrival."""
    return priority_of(strategy), strategy.request.arrival_time


@dataclass
class _Line:
    """One caller's waiting requests at one priority: preempted ones by arrival, then new ones."""

    preempted: list[DecodingStrategy] = field(default_factory=list)
    new: deque[DecodingStrategy] = field(default_factory=deque)

    def head(self) -> DecodingStrategy:
        return self.preempted[0] if self.preempted else self.new[0]

    def __bool__(self) -> bool:
        return bool(self.preempted or self.new)


class Shares:
    """The callers' weights, and what a caller's running rows weigh against them."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = dict(weights or {})

    def weight(self, caller: str) -> float:
        return self.weights.get(caller, 1.0)

    def share(self, caller: str, held: Mapping[str, int], change: int = 0) -> float:
        """Rows ``caller`` holds (plus ``change``) per unit of its weight."""
        return (held.get(caller, 0) + change) / self.weight(caller)


class WaitingLine:
    """Every waiting request, preempted ones included, in the policy's order (module docstring)."""

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        self._lines: dict[tuple[int, str], _Line] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[DecodingStrategy]:
        for line in list(self._lines.values()):
            yield from line.preempted
            yield from line.new

    def __contains__(self, strategy: DecodingStrategy) -> bool:
        line = self._lines.get((priority_of(strategy), caller_of(strategy)))
        return line is not None and (strategy in line.preempted or strategy in line.new)

    def preempted(self) -> list[DecodingStrategy]:
        return [strategy for line in self._lines.values() for strategy in line.preempted]

    def add(self, strategy: DecodingStrategy, preempted: bool = False) -> None:
        line = self._lines.setdefault((priority_of(strategy), caller_of(strategy)), _Line())
        if preempted:
            arrivals = [s.request.arrival_time for s in line.preempted]
            line.preempted.insert(bisect.bisect(arrivals, strategy.request.arrival_time), strategy)
        else:
            line.new.append(strategy)
        self._size += 1

    def remove(self, strategy: DecodingStrategy) -> bool:
        key = (priority_of(strategy), caller_of(strategy))
        line = self._lines.get(key)
        if line is None:
            return False
        if strategy in line.preempted:
            line.preempted.remove(strategy)
        elif strategy in line.new:
            line.new.remove(strategy)
        else:
            return False
        if not line:
            del self._lines[key]
        self._size -= 1
        return True

    def head(self, held: Mapping[str, int], preempted_only: bool = False) -> DecodingStrategy | None:
        """The request admitted next (``preempted_only``: the next of those that hold their row handles)."""
        lines = [(key, line) for key, line in self._lines.items() if line.preempted or not preempted_only]
        if not lines:
            return None
        top = min(priority for (priority, _), _ in lines)

        def standing(item: tuple[tuple[int, str], _Line]) -> tuple[float, float]:
            (_, caller), line = item
            first = line.preempted[0] if preempted_only else line.head()
            return self.shares.share(caller, held), first.request.arrival_time

        _, line = min((item for item in lines if item[0][0] == top), key=standing)
        return line.preempted[0] if preempted_only else line.head()


def victim_for(
    head: DecodingStrategy, running: list[DecodingStrategy], held: Mapping[str, int], shares: Shares
) -> DecodingStrategy | None:
    """The running request that gives way to ``head`` (module docstring), or None: nobody does."""
    lower = [s for s in running if priority_of(s) > priority_of(head)]
    if lower:
        return max(lower, key=run_order)
    wanted = shares.share(caller_of(head), held, head.num_slots)
    over = [
        s for s in running
        if priority_of(s) == priority_of(head) and caller_of(s) != caller_of(head)
        and shares.share(caller_of(s), held, -s.num_slots) >= wanted
    ]  # fmt: skip
    if not over:
        return None
    return max(over, key=lambda s: (shares.share(caller_of(s), held), s.request.arrival_time))


def least_entitled(running: list[DecodingStrategy], held: Mapping[str, int], shares: Shares) -> DecodingStrategy:
    """The running request that gives way when a step runs out of KV blocks."""
    return max(running, key=lambda s: (priority_of(s), shares.share(caller_of(s), held), s.request.arrival_time))
