"""Compile before serving: the engine runs each shape the compiled forward specializes on, once.

This drives the engine (requests in, steps until done), so it belongs to the engine's start and
not to the compile module below the engine; ``decoding.engine.launch`` calls it when ``--compile``
is on, before the server reports ready.
"""

from __future__ import annotations

import time

import torch

from decoding.engine.core import Engine
from decoding.params import GenerationParams


def warm_up(engine: Engine, prompt_ids: list[int]) -> float:
    """Compile before serving: run the shapes the forward specializes on (many tokens a step, then one).

    A batch of two prompts gives multi-token steps, a lone request one-token steps; the compiler
    keeps a graph for each (``decoding.model.compile``), so afterwards no request waits for a
    compile. The observer is muted so metrics count only real requests, and prompt plus answer stay
    shorter than a KV block (16 tokens by default), so nothing is left in the prefix cache. Returns
    the seconds it took.
    """
    new_tokens = 3
    prompt = (prompt_ids * engine.pool.block_size)[: max(2, engine.pool.block_size - 1 - new_tokens)]
    start = time.perf_counter()
    with engine.muted(), torch.inference_mode():
        for batch in (["warm-up-a", "warm-up-b"], ["warm-up-c"]):
            for i, request_id in enumerate(batch):
                params = GenerationParams(max_new_tokens=new_tokens)
                engine.add_request(request_id, prompt[: len(prompt) - i], params)
            while engine.has_work():
                engine.step()
    # Every shape now has its graph, so only the guards that tell the graphs apart need checking:
    # the rest cost ~0.15 ms a compiled call.
    torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
    return time.perf_counter() - start
