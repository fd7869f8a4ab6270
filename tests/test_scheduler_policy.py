"""The scheduler's policy with no model: admission by (priority, fair share, arrival), who gives way to a
request that outranks the running ones, and the weighted shares callers get of the batch.

Requests here are stand-ins holding what the scheduler reads (rows, a prompt, priority, caller,
arrival); the pool is a real ``KVPool`` of a few tiny blocks, so admission, preemption and resuming
move real blocks. On the previous main the line was one FIFO: priorities and callers changed nothing.
"""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from decoding.engine.policy import Shares, least_entitled, victim_for
from decoding.engine.scheduler import Scheduler
from decoding.kv.pool import KVPool
from decoding.params import GenerationParams

_clock = itertools.count()


class Stub:
    """What the scheduler asks of a strategy: its rows and slots, its request's prompt and params."""

    def __init__(self, name: str, priority: int = 0, caller: str = "", rows: int = 1, prompt: int = 4) -> None:
        self.name = name
        params = GenerationParams(priority=priority, caller=caller)
        self.request = SimpleNamespace(prompt_ids=list(range(3, 3 + prompt)), params=params, error=None,
                                       arrival_time=float(next(_clock)), num_prefilled=0, num_cached_tokens=0,
                                       deadline=lambda: None)  # fmt: skip
        self.rows = rows
        self.slots: list[int] = []

    @property
    def num_slots(self) -> int:
        return self.rows

    def assign_slots(self, slots: list[int]) -> None:
        self.slots = slots

    def release_slots(self) -> list[int]:
        slots, self.slots = self.slots, []
        return slots

    def held_slots(self) -> list[int]:
        return list(self.slots)

    def cached_sequences(self) -> list[tuple[int, list[int]]]:
        return []

    reuses_prefix = False

    @property
    def prefill_slot(self) -> int:
        return self.slots[0]

    def __repr__(self) -> str:
        return self.name


def scheduler(max_rows: int, num_blocks: int = 64, weights: dict[str, float] | None = None) -> Scheduler:
    pool = KVPool(num_layers=1, num_blocks=num_blocks, num_kv_heads=1, head_dim=2, max_model_len=256,
                  dtype=torch.float32, device="cpu", num_slots=2 * max_rows, block_size=4)  # fmt: skip
    return Scheduler(pool, 64, max_rows=max_rows, weights=weights)


def admitted_names(s: Scheduler) -> list[str]:
    admitted, unfit = s.admit()
    assert not unfit
    return [a.name for a in admitted]


def finish(s: Scheduler, strategy: Stub) -> None:
    s.remove(strategy)


# ---- the order -----------------------------------------------------------------------------------------
def test_the_line_is_ordered_by_priority_then_arrival():
    s = scheduler(max_rows=1)
    for name, priority in (("p2", 2), ("p0a", 0), ("p1", 1), ("p0b", 0), ("m1", -1)):
        s.add(Stub(name, priority))
    order = []
    for _ in range(5):
        order += admitted_names(s)
        finish(s, s.running[0])
    assert order == ["m1", "p0a", "p0b", "p1", "p2"]  # previous main: p2, p0a, p1, p0b, m1


def test_one_caller_one_priority_is_first_come_first_served():
    s = scheduler(max_rows=2)
    stubs = [Stub(f"r{i}") for i in range(6)]
    for stub in stubs:
        s.add(stub)
    order = admitted_names(s)
    while s.running:
        finish(s, s.running[0])
        order += admitted_names(s)
    assert order == [f"r{i}" for i in range(6)]


def test_a_small_caller_is_not_starved_by_a_burst_that_came_first():
    s = scheduler(max_rows=8)
    for i in range(64):
        s.add(Stub(f"big{i}", caller="key:big"))
    for i in range(4):
        s.add(Stub(f"small{i}", caller="key:small"))
    admitted = admitted_names(s)
    # the batch's 8 rows are shared: all 4 of the small caller's requests run now, beside 4 of the burst
    assert sorted(n for n in admitted if n.startswith("small")) == [f"small{i}" for i in range(4)]
    assert len(admitted) == 8 and s.held == Counter({"key:big": 4, "key:small": 4})
    # the small caller's next request takes the next free row, ahead of the 60 still waiting
    finish(s, next(r for r in s.running if r.name == "small0"))
    s.add(Stub("small4", caller="key:small"))
    assert admitted_names(s) == ["small4"]


@pytest.mark.parametrize("weights", [{"key:a": 3.0, "key:b": 1.0}, {"key:a": 1.0, "key:b": 1.0}])
def test_backlogged_callers_share_the_batch_in_proportion_to_their_weights(weights):
    s = scheduler(max_rows=8, weights=weights)
    for i in range(200):
        s.add(Stub(f"a{i}", caller="key:a"))
        s.add(Stub(f"b{i}", caller="key:b"))
    served: Counter[str] = Counter()
    steps_left: dict[str, int] = {}
    for _ in range(60):  # every request runs 3 steps; a freed row goes to whoever is due
        for name in admitted_names(s):
            served[name[0]] += 1
            steps_left[name] = 3
        assert s.held == Counter({caller: 8 * weight / sum(weights.values()) for caller, weight in weights.items()})
        for running in list(s.running):
            steps_left[running.name] -= 1
            if steps_left[running.name] == 0:
                finish(s, running)
    total = weights["key:a"] + weights["key:b"]
    assert served["a"] / sum(served.values()) == pytest.approx(weights["key:a"] / total, abs=0.05)


# ---- who gives way -------------------------------------------------------------------------------------
def test_a_higher_priority_request_preempts_the_lowest_priority_newest_running_one():
    s = scheduler(max_rows=3)
    low_old, mid, low_new = Stub("low_old", 5), Stub("mid", 1), Stub("low_new", 5)
    for stub in (low_old, mid, low_new):
        s.add(stub)
    admitted_names(s)
    high = Stub("high", 0)
    s.add(high)
    assert admitted_names(s) == ["high"]
    assert s.preempted == [low_new] and high in s.running and low_old in s.running
    # nothing gives way to a request it does not outrank: a second priority-5 request waits
    s.add(Stub("low_later", 5))
    assert admitted_names(s) == []
    # the preempted one resumes (ahead of its caller's newer request) as soon as a row frees
    finish(s, high)
    assert admitted_names(s) == [] and low_new in s.running and not s.preempted


def test_a_caller_over_its_share_gives_way_and_the_two_never_take_turns():
    s = scheduler(max_rows=4)
    burst = [Stub(f"a{i}", caller="key:a") for i in range(4)]
    for stub in burst:
        s.add(stub)
    admitted_names(s)
    for i, expected in enumerate((["b0"], ["b1"], [])):
        s.add(Stub(f"b{i}", caller="key:b"))
        assert admitted_names(s) == expected
    # a's newest two gave way (a: 4 -> 2 rows, b: 0 -> 2); the third b request waits: a is at its share
    assert s.preempted == [burst[2], burst[3]] or s.preempted == [burst[3], burst[2]]
    assert s.held == Counter({"key:a": 2, "key:b": 2})
    before = list(s.running)
    assert admitted_names(s) == [] and s.running == before  # a's preempted ones do not preempt b back


def test_the_victim_choice_and_the_least_entitled():
    shares = Shares({"key:heavy": 1.0, "key:light": 1.0})
    low = Stub("low", 3, "key:light")
    heavy_old, heavy_new = Stub("heavy_old", 0, "key:heavy"), Stub("heavy_new", 0, "key:heavy")
    light = Stub("light", 0, "key:light")
    running = [heavy_old, heavy_new, light, low]
    held = Counter({"key:heavy": 2, "key:light": 2})
    # strictly lower priority first, whatever the shares
    assert victim_for(Stub("newcomer", 0, "key:other"), running, held, shares) is low
    # at equal priority, the other caller most over its share, its newest
    assert victim_for(Stub("newcomer", 3, "key:light"), [heavy_old, heavy_new, light], held, shares) is None
    held3 = Counter({"key:heavy": 3, "key:light": 1})
    assert victim_for(Stub("x", 0, "key:light"), [heavy_old, heavy_new, light], held3, shares) is heavy_new
    assert least_entitled(running, held, shares) is low
    assert least_entitled([heavy_old, heavy_new, light], held3, shares) is heavy_new


def test_when_kv_blocks_are_short_a_lower_priority_request_gives_its_blocks_back():
    s = scheduler(max_rows=8, num_blocks=12)  # 48 positions; reserve 1 block
    long_low = Stub("long_low", 4, prompt=40)  # 10 blocks
    s.add(long_low)
    assert admitted_names(s) == ["long_low"]
    high = Stub("high", 0, prompt=8)  # 2 blocks + the reserve
    s.add(high)
    assert admitted_names(s) == ["high"]
    assert s.preempted == [long_low] and s.swapped_blocks(long_low) == 10
    finish(s, high)
    assert admitted_names(s) == [] and long_low in s.running and s.pool.blocks.num_used == 10


def test_a_request_that_never_fits_fails_without_anyone_giving_way():
    s = scheduler(max_rows=2, num_blocks=12)
    running = Stub("running", 5)
    s.add(running)
    admitted_names(s)
    wide, huge = Stub("wide", 0, rows=3), Stub("huge", 0, prompt=60)
    s.add(wide)
    s.add(huge)
    admitted, unfit = s.admit()
    assert admitted == [] and {u.name for u, _ in unfit} == {"wide", "huge"}
    assert all("cannot hold this request even alone" in why for _, why in unfit)
    assert s.running == [running] and not s.preempted


def test_preempted_requests_holding_every_free_handle_resume_before_a_new_request_starts():
    s = scheduler(max_rows=2)  # 4 row handles: 2 running, 2 more for requests that gave way
    x, y = Stub("x", 5, rows=2), Stub("y", 3, rows=2)
    s.add(x)
    admitted_names(s)
    s.add(y)
    assert admitted_names(s) == ["y"] and s.preempted == [x]  # x keeps its 2 handles while it waits
    s.preempt(y)  # as a step short of KV blocks does (make_room): now nothing runs, no handle is free
    s.add(z := Stub("z", 0))
    assert admitted_names(s) == [] and s.running == [y]  # z cannot start without a handle: y resumes first
    finish(s, y)
    assert admitted_names(s) == ["z"] and s.preempted == [x]
    finish(s, z)
    assert admitted_names(s) == [] and s.running == [x]
