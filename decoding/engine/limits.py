"""What the engine is sized by: its limits, and the KV pools they size (the target's and each assistant's).

Contrastive search scores its candidates in scratch positions after a row (at most
``MAX_CONTRASTIVE_TOP_K``), so every row's room is the context plus that scratch; a pool that cannot
hold one request of the longest context is refused at start, with the flag to change. So is one that
cannot admit it with a row per ``--max-num-seqs`` (what the scheduler's admission asks): such a
request would otherwise wait forever.

The pool has two row handles per ``--max-num-seqs`` row: the running rows, and as many again for
requests that gave way (a preempted request keeps its handles, ``engine/scheduler.py``), so a
request that outranks the running ones finds a handle to start with. A handle is an index; the
blocks are what costs memory, and they are sized by the running rows alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decoding.engine.drafting import make_assistant
from decoding.engine.scheduler import admission_blocks
from decoding.kv.pool import DEFAULT_BLOCK_SIZE, KVPool
from decoding.model.seq2seq import is_encoder_decoder, max_encoder_positions
from decoding.params import MAX_CONTRASTIVE_TOP_K


@dataclass
class EngineLimits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    request_timeout: float | None = None
    kv_cache_bytes: int | None = None  # the KV pool's size; None: every row at full length
    kv_cache_blocks: int | None = None  # or its size in blocks (tests and benchmarks)
    block_size: int = DEFAULT_BLOCK_SIZE
    prefix_caching: bool = True
    caller_weights: dict[str, float] = field(default_factory=dict)  # caller -> its fair share's weight (1 if absent)
    max_prefill_share: float = 1.0  # the most of the time prompt work takes while rows decode (prefill_share.py)
    fair_share: str = "rows"  # rows: callers share the batch; steps: each step's rows too (step_shares.py)


def kv_pool_for(model: torch.nn.Module, limits: EngineLimits, device: torch.device) -> KVPool:
    """The target's pool, refused at start when one request of ``max_model_len`` cannot fit."""
    scratch = MAX_CONTRASTIVE_TOP_K  # contrastive candidates' scratch positions after a row
    # an encoder-decoder's request also holds its encoder's keys and values: a cross slot of its own
    encoder = max_encoder_positions(model.config) or 0 if is_encoder_decoder(model.config) else 0
    num_blocks = limits.kv_cache_blocks
    if num_blocks is None and limits.kv_cache_bytes is None:  # every running row at full length
        num_blocks = limits.max_num_seqs * (-(-(limits.max_model_len + scratch) // limits.block_size)
                                            + -(-encoder // limits.block_size))  # fmt: skip
    pool = KVPool.for_model(
        model, num_slots=(3 if encoder else 2) * limits.max_num_seqs, max_model_len=limits.max_model_len + scratch,
        device=device,
        memory_bytes=limits.kv_cache_bytes, num_blocks=num_blocks, block_size=limits.block_size,
        prefix_caching=limits.prefix_caching,
    )  # fmt: skip
    num_blocks = pool.blocks.num_blocks
    if num_blocks < pool.blocks_for(limits.max_model_len + scratch):
        raise ValueError(
            f"--kv-cache-memory holds {num_blocks * pool.block_size} tokens, fewer than "
            f"one request of --max-model-len {limits.max_model_len} needs; raise it or lower --max-model-len"
        )
    # admitting the widest request (a row per --max-num-seqs) with the longest prompt
    needed = admission_blocks(pool.blocks_for(limits.max_model_len), limits.max_num_seqs, num_blocks)
    if num_blocks < needed:
        raise ValueError(
            f"--kv-cache-memory holds {num_blocks} blocks of {pool.block_size} tokens, fewer than the {needed} that "
            f"admitting one request of --max-model-len {limits.max_model_len} with --max-num-seqs "
            f"{limits.max_num_seqs} rows needs (its prompt's blocks and a block per row); raise --kv-cache-memory "
            f"to {needed * pool.nbytes() // num_blocks} bytes, or lower --max-model-len or --max-num-seqs"
        )
    return pool


def assistant_drafters(
    assistants: dict[str, object], limits: EngineLimits, pool: KVPool, device: torch.device
) -> dict[str, object]:
    """``assistants``: name -> a model sharing the target's tokenizer, or a ``(model, tokenizer, eos
    ids)`` tuple for one that drafts through text; each gets a pool twice the target's (drafts run ahead)."""
    drafters = {}
    for name, assistant in assistants.items():
        model, tokenizer, eos = assistant if isinstance(assistant, tuple) else (assistant, None, None)
        drafters[name] = make_assistant(
            name, model, pool.num_slots, 2 * limits.max_model_len + MAX_CONTRASTIVE_TOP_K, device, tokenizer,
            eos, num_blocks=2 * pool.blocks.num_blocks,
        )  # fmt: skip
    return drafters
