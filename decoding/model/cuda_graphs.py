"""``--compile`` on a GPU: the one-token decode step replayed from CUDA graphs, one per bucket.

A small model on a GPU is bound by launches, not by the GPU: SmolLM2's 30 layers are some 400
kernel launches a step, each costing microseconds of Python and driver time for microseconds of
work. A CUDA graph records a step's launches once and replays them with one call. A graph's shapes
are fixed, so a decode-only step is padded to a bucket of rows (1, 2, 4, 8, 16, 24, 32, ...) and its
block tables to a bucket of widths (powers of two blocks); the padding rows write and read the
pool's scratch block (``KVPool.scratch_block``, held by no row) and their logits are dropped. A graph
is captured the first time its bucket is met (the engine's warm-up meets the smallest) and all share
one memory pool. Steps a graph cannot stand for (prompt chunks, drafts to verify, contrastive
candidates, forwards hooked for hidden states or an early exit) run eagerly, as on a CPU.

Why not inductor's ``torch.compile`` here, as on the CPU: its one-token graph exists to call the
CPU paged-attention kernel with no Python between layers; on a GPU the launches themselves are the
cost, and a graph of the eager step removes them with nothing to trace or compile (a capture takes
milliseconds, not the CPU's half minute).

``replay=False`` runs the same padded, static step eagerly: the CPU tests check the padding, the
scratch block and the buckets with it, where no CUDA graph can be captured.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decoding.kv.pool import KVPool
from decoding.model.attention import StepLayout

logger = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MIN_WIDTH = 4  # blocks: a short row's table pads to this many
CUDA_GRAPHS_MARK = "_decoda_cuda_graphs"

# (input_ids [1, rows], position_ids [1, rows], logits_to_keep [rows], layout) -> logits [rows, vocab]
StepCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, StepLayout], torch.Tensor]


def row_bucket(rows: int) -> int:
    return ROW_BUCKETS[bisect.bisect_left(ROW_BUCKETS, rows)] if rows <= ROW_BUCKETS[-1] else rows


def width_bucket(blocks: int) -> int:
    width = MIN_WIDTH
    while width < blocks:
        width *= 2
    return width


def use_cuda_graphs(model: torch.nn.Module) -> None:
    """Mark ``model`` so its runner replays decode steps from CUDA graphs (``--compile`` on a GPU)."""
    setattr(model, CUDA_GRAPHS_MARK, True)


def wants_cuda_graphs(model: torch.nn.Module) -> bool:
    return bool(getattr(model, CUDA_GRAPHS_MARK, False))


@dataclass
class _Step:
    """One bucket's static inputs (one int64 buffer, viewed per field), its layout and its replay."""

    rows: int
    width: int
    buffer: torch.Tensor  # [5 * rows + rows * width]: ids, positions, blocks, offsets, lengths, tables
    logits: torch.Tensor | None = None  # the graph's output, rewritten by each replay
    graph: torch.cuda.CUDAGraph | None = None
    # the eager step; it also holds what the graph reads by address (the kept positions, the layout
    # with its derived tensors): freed, their memory would be reused while the graph still reads it
    run: Callable[[], torch.Tensor] | None = None


class DecodeGraphs:
    """Decode-only steps of one runner, padded to buckets and replayed (or run) on static inputs."""

    def __init__(self, pool: KVPool, device: torch.device, call: StepCall, *, replay: bool = True) -> None:
        self.pool, self.device, self.call, self.replay = pool, device, call, replay
        self.max_rows = pool.num_slots
        self.max_width = width_bucket(pool.blocks_for(pool.max_model_len))
        self._steps: dict[tuple[int, int], _Step] = {}
        self._memory = torch.cuda.graph_pool_handle() if replay else None
        self.captures = 0  # how many graphs were captured (a test reads it)
        self.failed: str | None = None  # why a capture failed: every step runs eagerly from then on

    def serves(self, rows: list) -> bool:  # noqa: ANN001 (RowInput: the runner's, which imports this module)
        """Whether every row is a plain decode row: one token, its logits, no hidden states."""
        return self.failed is None and 0 < len(rows) <= self.max_rows and all(
            len(row.token_ids) == 1 and row.logits_from == 0 and not row.siblings and not row.hidden_layers
            for row in rows
        )

    def forward(self, rows: list) -> list[torch.Tensor] | None:  # noqa: ANN001
        """Per row, float32 logits ``[1, vocab]``: the step written into the bucket's inputs and replayed;
        None where the bucket's graph could not be captured (the caller runs the step eagerly)."""
        pool = self.pool
        for row in rows:
            pool.prepare(row.slot, row.start, row.start + 1)
        width = min(self.max_width, width_bucket(max(pool.blocks_for(row.start + 1) for row in rows)))
        step = self._steps.get((row_bucket(len(rows)), width))
        if step is None:
            try:
                step = self._capture(row_bucket(len(rows)), width)
            except Exception as error:  # a model whose forward syncs with the host cannot be captured
                self.failed = f"{type(error).__name__}: {error}"
                logger.warning("CUDA graph capture failed, decode steps run eagerly: %s", self.failed)
                return None
        step.buffer.copy_(self._values(rows, step), non_blocking=True)
        if step.graph is not None:
            step.graph.replay()
            logits = step.logits
        else:
            logits = step.run()
        kept = logits[: len(rows)].float()
        return [kept[i : i + 1] for i in range(len(rows))]

    def _values(self, rows: list, step: _Step) -> torch.Tensor:  # noqa: ANN001
        """The host's side of the step: every row's token, position, write slot, length and table, padded."""
        pool, size, scratch = self.pool, self.pool.block_size, self.pool.scratch_block
        padding = step.rows - len(rows)
        ids = [row.token_ids[0] for row in rows] + [0] * padding
        positions = [row.start for row in rows] + [0] * padding
        blocks = [pool.tables[row.slot][row.start // size] for row in rows] + [scratch] * padding
        offsets = [row.start % size for row in rows] + [0] * padding
        lengths = [row.start + 1 for row in rows] + [1] * padding
        tables: list[int] = []
        for row in rows:
            table = pool.tables[row.slot][: pool.blocks_for(row.start + 1)]
            tables += table + [scratch] * (step.width - len(table))
        tables += [scratch] * (step.width * padding)
        # built on the host, copied into the bucket's device buffer in one transfer
        return torch.tensor(ids + positions + blocks + offsets + lengths + tables, dtype=torch.long, device="cpu")

    def _capture(self, rows: int, width: int) -> _Step:
        buffer = torch.zeros(5 * rows + rows * width, dtype=torch.long, device=self.device)
        step = _Step(rows, width, buffer)
        buffer.copy_(self._values([], step))  # every row padding: the warm-up writes the scratch block only
        fields = buffer[: 5 * rows].view(5, rows)
        layout = StepLayout.decode_only(self.pool, {
            "token_blocks": fields[2], "token_offsets": fields[3], "token_positions": fields[1],
            "decode_lengths": fields[4], "decode_tables": buffer[5 * rows :].view(rows, width),
        })  # fmt: skip
        keep = torch.arange(rows, device=self.device)

        def run() -> torch.Tensor:
            layout._masks.clear()  # what the layout derives from its inputs is derived again, in the graph
            return self.call(fields[0].unsqueeze(0), fields[1].unsqueeze(0), keep, layout)

        step.run = run
        if self.replay:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # allocator and library handles warmed outside the capture
                run()
            torch.cuda.current_stream(self.device).wait_stream(side)
            step.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(step.graph, pool=self._memory):
                step.logits = run()
            self.captures += 1
        self._steps[(rows, width)] = step
        return step
