"""The paged KV cache: blocks shared and copied on write, the prefix cache, preemption, the kernel.

Every strategy is run with the prefix cache cold and warm and must give the same tokens; a pool
too small for the load must preempt and resume requests without changing a single token.
"""

from __future__ import annotations

import random

import pytest
import torch

from decoding.kv.blocks import BlockAllocator, OutOfBlocksError
from decoding.kv.paged_attention import (
    _gathered,
    grouped_attention,
    native_available,
    paged_decode,
    paged_write_decode,
    published_step,
    step_attention,
)
from decoding.kv.pool import KVPool
from decoding.params import GenerationParams
from decoding.telemetry import EngineObserver
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2
VOCAB = 49152


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=3)


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer):
    return smollm2_tokenizer


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


# ---- blocks ------------------------------------------------------------------------------------------
def test_blocks_are_counted_shared_and_cached_blocks_wait_lru_until_needed():
    blocks = BlockAllocator(3)
    a, b = blocks.take(), blocks.take()
    blocks.share(a)
    assert blocks.is_shared(a) and blocks.num_free == 1
    parent = blocks.register(0, (1, 2), a)
    blocks.register(parent, (3, 4), b)
    blocks.release(a)
    blocks.release(a)  # nobody holds a: cached, still free to take
    blocks.release(b)
    assert blocks.num_free == 3 and blocks.num_cached == 2
    assert blocks.match([1, 2, 3, 4, 5], 2, 5) == [a, b]
    assert blocks.match([1, 2, 9, 9], 2, 4) == [a]
    assert blocks.match([1, 2, 3, 4], 2, 3) == [a]  # never more than max_tokens
    c = blocks.take()  # the never-used block first
    assert c not in (a, b)
    blocks.take()  # then the least recently used cached one: b (a was matched last)
    assert blocks.match([1, 2, 3, 4], 2, 4) == [a] and blocks.num_cached == 1
    blocks.take()
    with pytest.raises(OutOfBlocksError):
        blocks.take()


def test_a_finished_rows_tail_is_evicted_before_its_head():
    """Room taken from a cached conversation costs its last blocks, not its first: the rest stays a prefix."""
    pool = KVPool(num_layers=1, num_blocks=4, num_kv_heads=1, head_dim=2, max_model_len=64, dtype=torch.float32,
                  device="cpu", num_slots=2, block_size=4)  # fmt: skip
    conversation = list(range(10, 22))  # 3 full blocks
    row = pool.allocate()
    pool.prepare(row, 0, 12)
    pool.register(row, conversation)
    pool.free(row)
    other = pool.allocate()
    pool.prepare(other, 0, 8)  # the never-used block, then one cached block must go
    assert pool.blocks.num_cached == 2
    again = pool.allocate()
    assert pool.attach_prefix(again, conversation, 12) == 8


def test_a_prefix_is_found_by_its_whole_chain_not_by_its_last_block():
    blocks = BlockAllocator(4)
    first, second = blocks.take(), blocks.take()
    blocks.register(blocks.register(0, (1, 1), first), (2, 2), second)
    assert blocks.match([9, 9, 2, 2], 2, 4) == []  # same second block, other parent


def test_copy_on_write_copies_only_the_block_written():
    pool = KVPool(num_layers=1, num_blocks=8, num_kv_heads=1, head_dim=2, max_model_len=64, dtype=torch.float32,
                  device="cpu", num_slots=3, block_size=4)  # fmt: skip
    src, dst = pool.allocate(), pool.allocate()
    pool.prepare(src, 0, 10)  # 3 blocks
    pool.keys[0][pool.tables[src]] = torch.arange(3.0)[:, None, None, None]
    pool.copy_prefix(src, dst, 10)
    assert pool.tables[dst] == pool.tables[src] and pool.num_copied_blocks == 0
    pool.prepare(dst, 10, 11)  # writes into the third, shared block
    assert pool.num_copied_blocks == 1
    assert pool.tables[dst][:2] == pool.tables[src][:2] and pool.tables[dst][2] != pool.tables[src][2]
    assert float(pool.keys[0][pool.tables[dst][2]].mean()) == 2.0  # the copy holds the original's K/V
    pool.free(src)
    pool.free(dst)
    assert pool.blocks.num_free == 8


# ---- the decode kernel ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_paged_decode_equals_dense_attention(dtype, window):
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, block, num_blocks = 5, 6, 2, 16, 4, 40
    keys = torch.randn(num_blocks, kv_heads, block, dim).to(dtype)
    values = torch.randn(num_blocks, kv_heads, block, dim).to(dtype)
    lengths = torch.tensor([1, 4, 7, 13, 20])
    order = torch.randperm(num_blocks).tolist()
    tables = torch.tensor([order[r * 5 : r * 5 + 5] for r in range(rows)])
    firsts = torch.zeros(rows, dtype=torch.long) if window is None else (lengths - window).clamp(min=0)
    query = torch.randn(rows, heads, dim).to(dtype)
    expected = []
    for r in range(rows):  # dense reference: each row's positions in order
        k = keys[tables[r]].transpose(0, 1).reshape(kv_heads, -1, dim)[:, firsts[r] : lengths[r]]
        v = values[tables[r]].transpose(0, 1).reshape(kv_heads, -1, dim)[:, firsts[r] : lengths[r]]
        bias = torch.zeros(1, 1, 1, k.shape[1])
        expected.append(grouped_attention(query[r : r + 1, :, None], k[None], v[None], bias, 0.25)[0, :, 0])
    expected = torch.stack(expected).float()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    gathered = _gathered(query, keys, values, tables, lengths, firsts, 0.25).float()
    assert torch.allclose(gathered, expected, atol=tolerance)
    if native_available():
        native = paged_decode(query, keys, values, tables, lengths, firsts, 0.25).float()
        assert torch.allclose(native, expected, atol=tolerance)


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_the_fused_write_and_decode_equals_writing_then_attending(model_dtype, pool_dtype):
    """One native call per layer does exactly what the PyTorch writes and the decode kernel do."""
    if not native_available():
        pytest.skip("no native kernel: the PyTorch path serves")
    torch.manual_seed(1)
    heads, kv_heads, dim, block, num_blocks = 6, 2, 16, 4, 40
    rows, tokens = 3, 7  # three decode rows, then a 4-token chunk
    pool_keys = torch.randn(num_blocks, kv_heads, block, dim).to(pool_dtype)
    pool_values = torch.randn(num_blocks, kv_heads, block, dim).to(pool_dtype)
    # the model's tensors as its attention receives them: [1, tokens, heads, dim] transposed (strided)
    query = torch.randn(1, tokens, heads, dim).to(model_dtype).transpose(1, 2)[0]
    key = torch.randn(1, tokens, kv_heads, dim).to(model_dtype).transpose(1, 2)[0]
    value = torch.randn(1, kv_heads, tokens, dim).to(model_dtype)[0]
    tables = torch.tensor([[3, 9, 4], [12, 0, 0], [20, 21, 22]])
    lengths = torch.tensor([10, 2, 12])
    firsts = torch.tensor([0, 0, 5])
    token_blocks = torch.tensor([4, 12, 22, 30, 30, 31, 31])  # each decode row's last position, then the chunk
    token_offsets = torch.tensor([1, 1, 3, 2, 3, 0, 1])

    keys, values = pool_keys.clone(), pool_values.clone()
    keys[token_blocks, :, token_offsets] = key.transpose(0, 1).to(pool_dtype)
    values[token_blocks, :, token_offsets] = value.transpose(0, 1).to(pool_dtype)
    expected = paged_decode(query[:, :rows].transpose(0, 1), keys, values, tables, lengths, firsts, 0.3)

    fused_keys, fused_values = pool_keys.clone(), pool_values.clone()
    out = paged_write_decode(
        query, key, value, fused_keys, fused_values, token_blocks, token_offsets, tables, lengths, firsts, 0.3
    )
    assert out is not None and out.dtype == model_dtype
    assert torch.equal(fused_keys, keys) and torch.equal(fused_values, values)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_a_published_step_attends_as_the_fused_call(pool_dtype, model_dtype, window):
    """The compiled one-token step's operator (tables published once a step, the layer's pool picked
    by its index) writes and attends exactly as the fused call given the same tensors, and both equal
    the gathering path (one row: each thread takes a share of the query heads, not of the K/V heads)."""
    if not native_available():
        pytest.skip("no native kernel: the PyTorch path serves")
    torch.manual_seed(2)
    heads, kv_heads, dim, block, num_blocks, layers = 6, 2, 16, 4, 12, 3
    pools = [torch.randn(num_blocks, kv_heads, block, dim).to(pool_dtype) for _ in range(2 * layers)]
    keys, values = pools[:layers], pools[layers:]
    query = torch.randn(1, 1, heads, dim).to(model_dtype).transpose(1, 2)  # [1, heads, 1, dim], strided as the model's
    key, value = torch.randn(1, kv_heads, 1, dim).to(model_dtype), torch.randn(1, kv_heads, 1, dim).to(model_dtype)
    tables, lengths = torch.tensor([[7, 2, 9]]), torch.tensor([11])
    token_blocks, token_offsets = torch.tensor([9]), torch.tensor([2])
    firsts = torch.zeros(1, dtype=torch.long) if window is None else (lengths - window).clamp(min=0)
    fused_keys, fused_values = keys[1].clone(), values[1].clone()
    expected = paged_write_decode(query[0], key[0], value[0], fused_keys, fused_values, token_blocks,
                                  token_offsets, tables, lengths, firsts, 0.3)  # fmt: skip
    with published_step(keys, values, token_blocks, token_offsets, tables, lengths):
        out = step_attention(query, key, value, torch.tensor(1), 0.3, window)
    assert out.shape == (1, 1, heads, dim)
    assert torch.equal(out[0], expected)
    assert torch.equal(keys[1], fused_keys) and torch.equal(values[1], fused_values)
    row_query = query[0].transpose(0, 1).to(pool_dtype)
    gathered = _gathered(row_query, fused_keys, fused_values, tables, lengths, firsts, 0.3)
    tolerance = 1e-5 if model_dtype == pool_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out[0].float(), gathered.float(), atol=tolerance, rtol=tolerance)
    with pytest.raises(RuntimeError, match="no step published"):  # the step's tables do not outlive it
        step_attention(query, key, value, torch.tensor(1), 0.3, window)


def test_the_native_kernel_is_built_where_a_compiler_is():
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine: the gathering fallback serves (tested above)")
    assert native_available()


# ---- the prefix cache never changes an output -----------------------------------------------------
STRATEGIES = {
    "greedy": GenerationParams(max_new_tokens=12),
    "sampling": GenerationParams(max_new_tokens=12, do_sample=True, temperature=0.9, top_k=50, seed=7),
    "n2": GenerationParams(max_new_tokens=8, do_sample=True, n=2, seed=3),
    "beam": GenerationParams(max_new_tokens=8, num_beams=3, n=2),
    "group_beam": GenerationParams(max_new_tokens=8, num_beams=4, num_beam_groups=2, diversity_penalty=0.5),
    "contrastive": GenerationParams(max_new_tokens=8, penalty_alpha=0.6, top_k=4),
    "dola": GenerationParams(max_new_tokens=8, dola_layers="low", repetition_penalty=1.2),
    "prompt_lookup": GenerationParams(max_new_tokens=12, prompt_lookup_num_tokens=3),
    "early_exit": GenerationParams(max_new_tokens=12, assistant_early_exit=1),
    "guidance": GenerationParams(max_new_tokens=8, guidance_scale=1.5, negative_prompt_ids=[5, 6, 7]),
}


def outputs(harness: EngineHarness, request_id: str, n: int) -> list[list[int]]:
    return [harness.token_ids(request_id, index) for index in range(n)]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_gives_the_same_tokens_with_the_cache_cold_and_warm(model, name, tok):
    params = STRATEGIES[name]
    shared = prompt(40, seed=11)
    n = params.n
    harness = EngineHarness(model, tok, [EOS], block_size=8)
    harness.add("cold", shared, params)
    harness.run()
    harness.add("warm", shared, params)
    harness.run()
    uncached = EngineHarness(model, tok, [EOS], block_size=8, prefix_caching=False)
    uncached.add("plain", shared, params)
    uncached.run()
    assert outputs(harness, "warm", n) == outputs(harness, "cold", n) == outputs(uncached, "plain", n)
    warm = harness.outputs["warm"][-1]
    if name == "contrastive":  # it needs every prompt position's hidden state: always computed
        assert warm.num_cached_tokens == 0
    else:
        assert warm.num_cached_tokens == 32  # 4 full blocks of 8; the last prompt token is always computed
    assert harness.outputs["cold"][-1].num_cached_tokens == 0


def test_a_chat_turn_reuses_the_previous_turn_including_its_answer(model, tok):
    harness = EngineHarness(model, tok, [EOS], block_size=4)
    first = prompt(21, seed=2)
    harness.add("turn1", first, GenerationParams(max_new_tokens=10, ignore_eos=True))
    harness.run()
    answer = harness.token_ids("turn1")
    second = first + answer + prompt(5, seed=9)
    harness.add("turn2", second, GenerationParams(max_new_tokens=6))
    harness.run()
    # the prompt and all but the last (uncached) generated token, in whole blocks
    assert harness.outputs["turn2"][-1].num_cached_tokens == (len(first) + len(answer) - 1) // 4 * 4
    fresh = EngineHarness(model, tok, [EOS], block_size=4, prefix_caching=False)
    fresh.add("turn2", second, GenerationParams(max_new_tokens=6))
    fresh.run()
    assert harness.token_ids("turn2") == fresh.token_ids("turn2")


def test_prompt_logprobs_compute_the_whole_prompt(model, tok):
    harness = EngineHarness(model, tok, [EOS], block_size=4)
    shared = prompt(20, seed=4)
    harness.add("a", shared, GenerationParams(max_new_tokens=2))
    harness.run()
    harness.add("b", shared, GenerationParams(max_new_tokens=2, prompt_logprobs=1))
    harness.run()
    final = harness.outputs["b"]
    assert final[-1].num_cached_tokens == 0
    assert len([o for o in final if o.prompt_logprobs][0].prompt_logprobs) == len(shared)


# ---- sharing and preemption -----------------------------------------------------------------------
def test_a_beam_step_copies_no_shared_prefix(model, tok):
    harness = EngineHarness(model, tok, [EOS], block_size=4)
    harness.add("beam", prompt(64, seed=5), GenerationParams(max_new_tokens=10, num_beams=4, ignore_eos=True))
    harness.run()
    # at most one block per beam per step (its partial last block), never the 16 prompt blocks
    assert harness.engine.pool.num_copied_blocks <= 4 * 10


@pytest.mark.parametrize("value_head_dim", [None, 3], ids=["mha", "mla-narrower-values"])
def test_swapping_rows_out_and_in_keeps_their_shared_blocks_shared(value_head_dim):
    pool = KVPool(num_layers=2, num_blocks=12, num_kv_heads=2, head_dim=4, max_model_len=64, dtype=torch.float32,
                  device="cpu", num_slots=4, block_size=16, value_head_dim=value_head_dim)  # fmt: skip
    for layer in pool.keys + pool.values:
        layer.copy_(torch.randn(layer.shape))
    pool.prepare(0, 0, 40)  # a 40-token prompt: 3 blocks, the last one partial
    for slot in (1, 2, 3):
        pool.copy_prefix(0, slot, 40)
    for slot in range(4):  # each row's first token copies the shared last block (the last holder writes in it)
        pool.prepare(slot, 40, 41)

    def contents() -> list[torch.Tensor]:
        return [layer[pool.tables[s]] for s in range(4) for layer in pool.keys + pool.values]

    before, held = contents(), pool.blocks.num_used
    swapped = pool.swap_out([0, 1, 2, 3])
    assert held == 2 + 4 and swapped.num_blocks == held  # the two shared prompt blocks copied once, not 4 times
    assert swapped.nbytes == held * pool.nbytes() // pool.blocks.num_blocks
    assert pool.blocks.num_used == 0 and all(not table for table in pool.tables)
    other = pool.blocks.take()  # the pool moved on meanwhile
    pool.swap_in(swapped)
    assert pool.blocks.num_used == held + 1 and other not in {b for table in pool.tables for b in table}
    assert len({tuple(table[:2]) for table in pool.tables}) == 1  # shared again, by all four rows
    assert all(pool.blocks.refs[block] == 4 for block in pool.tables[0][:2])
    assert len({table[2] for table in pool.tables}) == 4 and all(pool.blocks.refs[t[2]] == 1 for t in pool.tables)
    assert all(torch.equal(a, b) for a, b in zip(before, contents(), strict=True))
    pool.prepare(1, 16, 17)  # a write into a shared block still copies it first
    assert pool.tables[1][1] != pool.tables[0][1] and pool.blocks.refs[pool.tables[0][1]] == 3


class _CountPreemptions(EngineObserver):
    def __init__(self) -> None:
        self.preempted = 0

    def on_preempted(self) -> None:
        self.preempted += 1


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_new_tokens=30, ignore_eos=True),
        GenerationParams(max_new_tokens=30, ignore_eos=True, do_sample=True, seed=5),
        GenerationParams(max_new_tokens=20, ignore_eos=True, num_beams=2),
        GenerationParams(max_new_tokens=30, ignore_eos=True, prompt_lookup_num_tokens=2),
        GenerationParams(max_new_tokens=20, ignore_eos=True, do_sample=True, seed=5, n=3),
        GenerationParams(max_new_tokens=20, ignore_eos=True, guidance_scale=1.5),
    ],
    ids=["greedy", "sampling", "beam", "prompt_lookup", "n3", "guidance"],
)
def test_preempted_requests_resume_with_the_same_output(model, params, tok):
    prompts = [prompt(20 + 3 * i, seed=20 + i) for i in range(6)]
    roomy = EngineHarness(model, tok, [EOS], block_size=4, prefix_caching=False)
    tight = EngineHarness(model, tok, [EOS], block_size=4, prefix_caching=False, kv_cache_blocks=72, max_model_len=192)
    tight.engine.scheduler.observer = counted = _CountPreemptions()
    for harness in (roomy, tight):
        for i, ids in enumerate(prompts):
            harness.add(f"r{i}", ids, params)
        harness.run()
    assert counted.preempted > 0
    preempted = tight.engine.scheduler
    for i in range(len(prompts)):
        for index in range(params.n):  # every row of an n > 1 request: swapped out and in sharing its prompt
            assert tight.token_ids(f"r{i}", index) == roomy.token_ids(f"r{i}", index), f"request {i} row {index}"
            assert len(tight.token_ids(f"r{i}", index)) == params.max_new_tokens
    assert preempted.pool.blocks.num_used == 0 and not preempted.preempted
    assert tight.engine.observer is not None


def test_preemption_is_counted(model, tok):
    class Count:
        preempted = 0

    from decoding.telemetry import EngineObserver

    class Observer(EngineObserver):
        def on_preempted(self) -> None:
            Count.preempted += 1

    harness = EngineHarness(
        model, tok, [EOS], block_size=4, prefix_caching=False, kv_cache_blocks=72, max_model_len=192
    )
    harness.engine.scheduler.observer = Observer()
    for i in range(6):
        harness.add(f"r{i}", prompt(30, seed=i), GenerationParams(max_new_tokens=30, ignore_eos=True))
    harness.run()
    assert Count.preempted > 0


def test_a_request_larger_than_the_whole_cache_fails_clearly(model, tok):
    with pytest.raises(ValueError, match="kv-cache-memory"):
        EngineHarness(model, tok, [EOS], block_size=4, kv_cache_blocks=10, max_model_len=256)


def test_memory_held_follows_the_tokens(model, tok):
    """16 rows of ~200 tokens hold a fraction of what a slot per row at full length reserved."""
    harness = EngineHarness(model, tok, [EOS], max_model_len=2048, max_num_seqs=16)
    for i in range(16):
        harness.add(f"r{i}", prompt(190, seed=i), GenerationParams(max_new_tokens=10, ignore_eos=True))
    pool, held = harness.engine.pool, []
    with torch.inference_mode():
        while harness.engine.has_work():
            harness.engine.step()
            held.append(pool.nbytes_held())
    slot_reservation = pool.nbytes() * 16 * (2048 + 32) // (pool.blocks.num_blocks * pool.block_size)
    assert max(held) <= slot_reservation / 5
