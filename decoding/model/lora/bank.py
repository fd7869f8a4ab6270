"""The resident adapters' matrices, stacked per wrapped linear, and the step that reads them.

Each wrapped linear (``LoraLinear``) keeps, for ``--max-loras`` adapters plus the zero adapter at
index 0, every ``A`` side by side (``a_cat`` ``[in, slots * r]``) and every ``B`` stacked (``b_cat``
``[slots * r, out]``), ``r`` being ``--max-lora-rank`` (an adapter of a lower rank fills its first
columns, the rest stay zero). The runner opens a step with each packed token's adapter index
(``LoraBank.step``): the wrapped linears then add ``product.add_stacked`` (tokens of several adapters,
or of adapters and the base) or ``product.add_single`` (every token on one adapter) to the base
linear's output, which they never replace: a oneDNN-packed, quantized or plain linear computes
exactly what it computes without adapters. Outside a step, or in a step where no token has an
adapter, a wrapped linear is its base linear.

The step lives on the bank, which every wrapped linear holds, the way attention reads the runner's
``StepLayout``: one object per engine, set for one forward by the runner and cleared after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from decoding.model.anatomy import decoder_layers
from decoding.model.lora.adapter import LoraWeights
from decoding.model.lora.product import add_single, add_stacked, add_stacked_onednn, pack_onednn, uses_onednn

# one adapter's product by torch.mm up to this many tokens (a decode step): ~5 us a linear at one token,
# where oneDNN's call costs ~20 us; beyond it (mixed adapters, prompt chunks) oneDNN (product.uses_onednn)
SINGLE_MM_TOKENS = 16
TARGET_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraStep:
    """One forward's adapters: a ``[T, slots, 1]`` mask (each token's scale in its adapter's slot), or
    when every token uses one adapter, that adapter's slot, rank and scale."""

    num_tokens: int
    mask: torch.Tensor | None
    single: tuple[int, int, float] | None  # (slot, rank, scaling)


class LoraLinear(nn.Module):
    """A linear plus each token's low-rank delta; the base module is kept whole (``self.base``)."""

    def __init__(self, base: nn.Module, bank: LoraBank, in_features: int, out_features: int) -> None:
        super().__init__()
        self.base = base
        self.bank = bank
        self.in_features, self.out_features = in_features, out_features
        slots, rank = bank.num_slots, bank.max_rank
        dtype, device = bank.dtype, bank.device
        self.a_cat = torch.zeros(in_features, slots * rank, dtype=dtype, device=device)  # [in, slots * r]
        self.b_cat = torch.zeros(slots * rank, out_features, dtype=dtype, device=device)  # [slots * r, out]
        self.packed: tuple[torch.Tensor, torch.Tensor] | None = None  # oneDNN copies of A^T and B^T (CPU)
        self._pack()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.base(hidden)
        step = self.bank.current
        if step is None:
            return out
        flat = hidden.reshape(-1, self.in_features)
        if flat.shape[0] != step.num_tokens:
            raise RuntimeError(f"LoRA step has {step.num_tokens} tokens, the linear got {flat.shape[0]}")
        base = out.reshape(-1, self.out_features)
        r = self.bank.max_rank
        if step.single is not None:
            slot, rank, scaling = step.single
            a = self.a_cat[:, slot * r : slot * r + rank]
            b = self.b_cat[slot * r : slot * r + rank]
            summed = add_single(base, flat.to(a.dtype), a, b, scaling)
        elif self.packed is not None:  # oneDNN, as the base linears (product.uses_onednn)
            summed = add_stacked_onednn(base, flat.to(self.a_cat.dtype), *self.packed, step.mask, r)
        else:
            summed = add_stacked(base, flat.to(self.a_cat.dtype), self.a_cat, self.b_cat, step.mask, r)
        return summed.to(out.dtype).reshape(out.shape)

    def write(self, slot: int, matrices: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Put one adapter's ``(A [in, rank], B [rank, out])`` into ``slot`` (None: zeros)."""
        r = self.bank.max_rank
        self.a_cat[:, slot * r : (slot + 1) * r].zero_()
        self.b_cat[slot * r : (slot + 1) * r].zero_()
        if matrices is not None:
            a, b = matrices
            rank = a.shape[1]
            self.a_cat[:, slot * r : slot * r + rank].copy_(a)
            self.b_cat[slot * r : slot * r + rank].copy_(b)
        self._pack()

    def _pack(self) -> None:
        if self.bank.onednn:
            self.packed = (pack_onednn(self.a_cat.t()), pack_onednn(self.b_cat.t()))

    def extra_repr(self) -> str:
        return f"lora slots={self.bank.num_slots}, max_rank={self.bank.max_rank}"


class LoraBank:
    """Every wrapped linear of one model, the adapter each slot holds, and the current step."""

    def __init__(self, model: nn.Module, max_loras: int, max_rank: int) -> None:
        if max_loras < 1 or max_rank < 1:
            raise ValueError(f"--max-loras and --max-lora-rank must be at least 1, got {max_loras}, {max_rank}")
        self.num_slots = max_loras + 1  # slot 0: the zero adapter (tokens without one)
        self.max_rank = max_rank
        first = next(model.parameters())
        self.device = first.device
        self.dtype = first.dtype if first.dtype.is_floating_point else torch.float32
        self.onednn = uses_onednn(self.device, self.dtype)
        self.scalings = [0.0] * self.num_slots
        self.ranks = [0] * self.num_slots
        self.current: LoraStep | None = None
        self.linears: dict[str, LoraLinear] = _wrap(model, self)

    def use_onednn(self, on: bool) -> None:
        """Run the products through oneDNN (``on``) or ``torch.mm`` (the bench compares the two)."""
        self.onednn = on and uses_onednn(self.device, self.dtype)
        for linear in self.linears.values():
            linear.packed = None
            linear._pack()

    @property
    def targets(self) -> dict[str, tuple[int, int]]:
        """Module name -> ``(in_features, out_features)`` of every linear an adapter may target."""
        return {name: (linear.in_features, linear.out_features) for name, linear in self.linears.items()}

    def write(self, slot: int, weights: LoraWeights | None) -> None:
        """Make ``slot`` hold ``weights`` (None: the zero adapter)."""
        for name, linear in self.linears.items():
            linear.write(slot, None if weights is None else weights.matrices.get(name))
        self.scalings[slot] = 0.0 if weights is None else weights.scaling
        self.ranks[slot] = 0 if weights is None else weights.rank

    def step_for(self, token_slots: list[int]) -> LoraStep | None:
        """The step of tokens whose adapters are ``token_slots`` (packed order); None when none has one."""
        used = set(token_slots)
        if used == {0}:
            return None
        if len(used) == 1 and (not self.onednn or len(token_slots) <= SINGLE_MM_TOKENS):
            (slot,) = used
            return LoraStep(len(token_slots), None, (slot, self.ranks[slot], self.scalings[slot]))
        index = torch.tensor(token_slots, dtype=torch.long, device=self.device)
        scale = torch.tensor(self.scalings, dtype=self.dtype, device=self.device)  # [slots]
        mask = torch.zeros(len(token_slots), self.num_slots, 1, dtype=self.dtype, device=self.device)
        mask[torch.arange(len(token_slots), device=self.device), index, 0] = scale[index]
        return LoraStep(len(token_slots), mask, None)

    @contextmanager
    def active(self, step: LoraStep | None) -> Iterator[None]:
        """The wrapped linears add ``step``'s deltas inside this block."""
        self.current = step
        try:
            yield
        finally:
            self.current = None


def _wrap(model: nn.Module, bank: LoraBank) -> dict[str, LoraLinear]:
    """Wrap each decoder layer's q/k/v/o and gate/up/down projections (whatever module computes them)."""
    names = {id(module): name for name, module in model.named_modules()}
    wrapped: dict[str, LoraLinear] = {}
    for layer in decoder_layers(model):
        for parent in list(layer.modules()):
            for child_name, child in list(parent.named_children()):
                if child_name not in TARGET_NAMES or isinstance(child, LoraLinear):
                    continue
                in_features, out_features = getattr(child, "in_features", None), getattr(child, "out_features", None)
                if not isinstance(in_features, int) or not isinstance(out_features, int):
                    continue  # not a linear (a fused MoE block named like one)
                linear = LoraLinear(child, bank, in_features, out_features)
                setattr(parent, child_name, linear)
                wrapped[names[id(child)]] = linear
    if not wrapped:
        raise ValueError("LoRA adapters: the served model has no q/k/v/o or gate/up/down projections to adapt")
    return wrapped
