"""Read single rows back out of a weight packed for PyTorch's CPU int4 kernel.

``_convert_weight_to_int4pack_for_cpu`` interleaves the rows of each block of output channels
(64 on AVX-512, 32 on AVX2; two rows share a byte), and the layout is the kernel's business, not a
documented format. A tied embedding must read rows from that same packed copy (keeping a second,
plain copy would double the largest tensor of a small model), so the layout is learned at run
time: pack a probe whose codes spell out their own position, read where each position landed, and
check the learned map on rows of the real weight before trusting it. Rows past the last whole
64-row block are kept aside as plain codes.
"""

from __future__ import annotations

import torch

PERIOD = 64  # rows per probed block; a multiple of every BLOCK_N the kernel uses (32, 64)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes in [0, 16) → the kernel's opaque uint8 ``[N, K / 2]``."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)


class PackedRows:
    """Gathers rows of int4 codes from a packed weight: ``rows(ids) -> [len(ids), K]`` uint8."""

    def __init__(self, packed: torch.Tensor, codes: torch.Tensor) -> None:
        num_rows, width = codes.shape
        self.width = width
        self.whole_rows = num_rows - num_rows % PERIOD
        self.offset, self.shift = _probe(width)  # [PERIOD, K] byte offset within a block, bit shift
        self.block_bytes = PERIOD * width // 2
        self.flat = packed.view(-1)
        self.tail = codes[self.whole_rows :].to(torch.uint8)  # [N % PERIOD, K]
        sample = torch.tensor([0, 1, PERIOD - 1, num_rows // 2, self.whole_rows - 1, num_rows - 1], device=codes.device)
        sample = torch.unique(sample)
        sample = sample[(sample >= 0) & (sample < num_rows)]
        if not torch.equal(self.rows(sample), codes[sample].to(torch.uint8)):
            raise RuntimeError("the int4 packed layout of this PyTorch build is not the probed one")

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Branch-free (no data-dependent ``if``), so a compiled forward traces it in one graph."""
        ids = ids.to(torch.long)
        if self.whole_rows == 0:
            return self.tail[ids]
        whole = (ids < self.whole_rows)[:, None]
        packed_ids = ids.clamp(max=self.whole_rows - 1)
        local = packed_ids % PERIOD
        base = (packed_ids // PERIOD) * self.block_bytes
        byte = self.flat[self.offset[local] + base[:, None]]
        from_packed = (byte >> self.shift[local]) & 0x0F
        if self.tail.shape[0] == 0:
            return from_packed
        tail_ids = (ids - self.whole_rows).clamp(min=0, max=self.tail.shape[0] - 1)
        return torch.where(whole, from_packed, self.tail[tail_ids])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.offset, self.shift, self.tail))


CPU = torch.device("cpu")  # the layout probed is that of PyTorch's CPU int4 kernel


def _probe(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where code ``(r, k)`` of a ``PERIOD``-row block lands: byte offset and shift (0 or 4)."""
    position = torch.arange(PERIOD * width, dtype=torch.int64, device=CPU).reshape(PERIOD, width)
    digits = (PERIOD * width - 1).bit_length() // 4 + 1
    low = torch.zeros(PERIOD * width // 2, dtype=torch.int64, device=CPU)
    high = torch.zeros_like(low)
    for digit in range(digits):
        packed = pack_int4((position >> (4 * digit)) & 0x0F).view(-1).to(torch.int64)
        low |= (packed & 0x0F) << (4 * digit)
        high |= (packed >> 4) << (4 * digit)
    offset = torch.empty(PERIOD * width, dtype=torch.int64, device=CPU)
    shift = torch.empty(PERIOD * width, dtype=torch.uint8, device=CPU)
    byte = torch.arange(PERIOD * width // 2, dtype=torch.int64, device=CPU)
    offset[low], shift[low] = byte, 0
    offset[high], shift[high] = byte, 4
    return offset.reshape(PERIOD, width).to(torch.int32), shift.reshape(PERIOD, width)
