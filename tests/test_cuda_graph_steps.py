"""The padded, static decode step that ``--compile`` replays from CUDA graphs on a GPU, run eagerly.

No CUDA graph can be captured on a CPU, but everything around the capture can be checked here: the
rows padded to a bucket and the tables to a width, the padding rows writing only the pool's scratch
block, the logits of real rows in their order, buckets reused from step to step. ``tests/gpu``
checks the captured graphs themselves on a GPU.
"""

from __future__ import annotations

import random

import torch

from decoding.kv.pool import KVPool
from decoding.model.cuda_graphs import row_bucket, use_cuda_graphs, width_bucket
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, as_served, hf_greedy, tiny_llama

EOS = 2


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 400) for _ in range(rng.randrange(2, 70))] for _ in range(count)]


def test_buckets():
    assert [row_bucket(n) for n in (1, 2, 3, 5, 9, 17, 25, 33)] == [1, 2, 4, 8, 16, 24, 32, 48]
    assert [width_bucket(n) for n in (1, 4, 5, 9, 33)] == [4, 4, 8, 16, 64]


def test_padded_static_steps_equal_hf_generate_across_buckets(smollm2_tokenizer):
    """Three, then five, then one row (finishing at different lengths), prompts crossing table widths:
    each request's greedy tokens are transformers' alone."""
    model = tiny_llama(400, seed=3)
    served = as_served(model)
    use_cuda_graphs(served)
    harness = EngineHarness(served, smollm2_tokenizer, [EOS], served=True, block_size=4)
    graphs = harness.engine.runner.graphs
    assert graphs is not None and not graphs.replay
    cases = {f"r{i}": (prompt, 6 + 3 * i) for i, prompt in enumerate(prompts(5, seed=1))}
    for request_id, (prompt, new) in cases.items():
        harness.add(request_id, prompt, GenerationParams(max_new_tokens=new))
    harness.run()
    for request_id, (prompt, new) in cases.items():
        assert harness.token_ids(request_id) == hf_greedy(model, prompt, new, eos_token_id=EOS), request_id
    assert {rows for rows, _ in graphs._steps} >= {1, 2, 4, 8}  # five rows, then fewer as they finish
    assert len({width for _, width in graphs._steps}) >= 2


def test_padding_rows_write_only_the_scratch_block(smollm2_tokenizer):
    served = as_served(tiny_llama(400, seed=4))
    use_cuda_graphs(served)
    harness = EngineHarness(served, smollm2_tokenizer, [EOS], served=True, block_size=4)
    pool: KVPool = harness.engine.pool
    for layer in pool.keys + pool.values:
        layer.fill_(7.0)
    graphs = harness.engine.runner.graphs
    with torch.inference_mode():
        graphs._capture(8, 4)  # a bucket of padding rows only, as a capture's warm-up runs it
        graphs._steps[(8, 4)].run()
    for layer in pool.keys + pool.values:
        assert bool((layer[: pool.scratch_block] == 7.0).all())  # no row's block touched
        assert not bool((layer[pool.scratch_block] == 7.0).all())  # the padding wrote the scratch block
