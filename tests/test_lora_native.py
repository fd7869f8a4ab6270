"""The native LoRA kernel (``decoding/model/lora/low_rank.cpp``): each token's delta against its own adapter,
added in place, equal to the float64 product within float32 rounding at any shape (ranks and widths that are
not multiples of its 16-lane vectors, many tokens, tokens without an adapter), at one and two threads; a
token's delta does not depend on the other tokens of its call; bad operands are refused with the reason."""

from __future__ import annotations

import pytest
import torch

from decoding.model.lora import native

pytestmark = pytest.mark.skipif(not native.serves(torch.device("cpu"), torch.float32), reason="no native kernel")


def _operands(tokens: int, slots: int, width: int, rank: int, out: int, seed: int):  # noqa: ANN202
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, width, generator=generator)
    a = torch.randn(slots, width, rank, generator=generator) / width**0.5
    b = torch.randn(slots, rank, out, generator=generator)
    token_slots = torch.randint(-1, slots, (tokens,), generator=generator)
    scales = torch.rand(slots, generator=generator) + 0.5
    base = torch.randn(tokens, out, generator=generator)
    return base, x, a, b, token_slots, scales


def _expected(base, x, a, b, token_slots, scales) -> torch.Tensor:  # noqa: ANN001
    rows = []
    for t, slot in enumerate(token_slots.tolist()):
        delta = 0 if slot < 0 else scales[slot].double() * (x[t].double() @ a[slot].double() @ b[slot].double())
        rows.append(base[t].double() + delta)
    return torch.stack(rows).float()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "tokens, slots, width, rank, out",
    [
        (1, 4, 576, 16, 1536),  # one client's decode step on SmolLM2's gate/up
        (1, 4, 1536, 16, 576),  # its down projection: A is the larger matrix
        (16, 4, 576, 16, 192),  # sixteen rows over four adapters and the base
        (3, 2, 100, 8, 37),  # a rank and widths off the vector width
        (40, 3, 64, 40, 70),  # a rank of two and a half vectors; more tokens than a tile
        (7, 1, 33, 1, 5),
    ],
)
def test_each_token_gets_its_own_adapters_delta(threads, tokens, slots, width, rank, out):
    base, x, a, b, token_slots, scales = _operands(tokens, slots, width, rank, out, seed=tokens + rank)
    expected = _expected(base, x, a, b, token_slots, scales)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        native.add_deltas(base, x, a, b, token_slots, scales)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(base, expected, rtol=1e-5, atol=1e-4)


def test_a_tokens_delta_does_not_depend_on_its_neighbours():
    base, x, a, b, token_slots, scales = _operands(12, 4, 576, 16, 576, seed=3)
    together = base.clone()
    native.add_deltas(together, x, a, b, token_slots, scales)
    for t in range(12):
        alone = base[t : t + 1].clone()
        native.add_deltas(alone, x[t : t + 1], a, b, token_slots[t : t + 1], scales)
        assert torch.equal(alone[0], together[t]), t


def test_tokens_without_an_adapter_are_left_alone():
    base, x, a, b, _, scales = _operands(5, 2, 64, 8, 32, seed=1)
    kept = base.clone()
    native.add_deltas(base, x, a, b, torch.full((5,), -1), scales)
    assert torch.equal(base, kept)


def test_bad_operands_are_refused_with_the_reason():
    base, x, a, b, token_slots, scales = _operands(4, 2, 64, 8, 32, seed=2)
    with pytest.raises(RuntimeError, match="names adapter 2 of 2"):
        native.add_deltas(base, x, a, b, torch.tensor([0, 2, -1, 1]), scales)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        native.add_deltas(base, x.double(), a, b, token_slots, scales)
    with pytest.raises(RuntimeError, match="one row per token"):
        native.add_deltas(base[:3], x[:3], a, b, token_slots, scales)
    with pytest.raises(RuntimeError, match="disagree"):
        native.add_deltas(base, x, a, b[:, :4].contiguous(), token_slots, scales)
