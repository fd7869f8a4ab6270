"""The resident adapters' matrices, stacked per wrapped linear, and the step that reads them.

Each wrapped linear (``LoraLinear``) keeps, for the ``--max-loras`` slots 1.. (slot 0, the zero
adapter of tokens without one, is in no matrix: nothing to multiply), every ``A`` side by side
(``a_cat`` ``[in, max_loras * r]``) and every ``B`` stacked (``b_cat`` ``[max_loras * r, out]``), ``r``
being ``--max-lora-rank`` (an adapter of a lower rank fills its first columns, the rest stay zero).
The runner opens a step with each packed token's adapter index (``LoraBank.step_for``): the wrapped
linears then add each token's delta to the base linear's output, in place. A step of few tokens, or
of several adapters, takes the native kernel (``native.add_deltas``, ``low_rank.cpp``: one call per
linear, each adapter's contiguous ``A`` (``a_rows`` ``[max_loras, in, r]``) and ``B`` read once for
its tokens) where it runs (float32 on a CPU); else ``product.add_single`` (every token on one
adapter: a long prompt chunk, where ``torch.mm``'s blocking wins), ``product.add_stacked`` (tokens
of several adapters, or of adapters and the base, over the slots the step uses) or
``product.add_padded`` (a long step whose adapters share its tokens evenly). A oneDNN-packed,
quantized or plain base linear computes exactly what it computes without adapters, into a tensor of
its own (each of them returns a fresh one; the block kernel's sibling parts copy their rows out of
the shared product). Outside a step, in a step where no token has an adapter, or in a one-adapter
step on a linear that adapter does not target, a wrapped linear is its base linear.

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
from decoding.model.lora.native import add_deltas, serves
from decoding.model.lora.product import (
    add_padded,
    add_single,
    add_stacked,
    add_stacked_onednn,
    pack_onednn,
    uses_onednn,
)

# a mixed step of at least this many tokens takes the padded product when its adapters' shares are even
# enough (padded, at most half the stacked rows): measured in product.py, below it the gather and the
# scatter cost more than the stacked product's extra columns
GROUPED_TOKENS = 64
# a one-adapter step of more tokens takes torch.mm's two products: the native kernel's 4- and 8-token tiles
# lose to its blocking from there (``python -m loadtests.bench_lora_product``: at 64 tokens 13.2 against
# 6.7 ms, at one 1.4 against 2.2); a mixed step takes the native kernel at any length (320 tokens over
# 4 adapters: 70 ms against the padded product's 82)
NATIVE_SINGLE_TOKENS = 16
PRODUCTS = ("native", "mm", "onednn")
TARGET_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraStep:
    """One forward's adapters. Every token on one adapter: its slot and scale (``single``). Else the
    adapters ``first..last-1`` of the stack (slot ``s`` is stack index ``s - 1``) and the ``mask``: the
    stacked product's ``[T, n, 1]`` (each token's scale in its adapter's column), or with ``padded``
    (``gather``, ``rows``, ``tokens`` of ``product.add_padded``) the padded groups' ``[n, m, 1]``. With
    ``token_slots`` (each token's stack index, -1 for none) the native kernel adds them all."""

    num_tokens: int
    single: tuple[int, float] | None = None  # (slot, scaling)
    adapters: tuple[int, int] = (0, 0)  # first, last (exclusive) stack index
    mask: torch.Tensor | None = None
    padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    token_slots: torch.Tensor | None = None


class LoraLinear:
    """A linear plus each token's low-rank delta. The projection module stays in the model, whole
    (``self.base``); only its ``forward`` is replaced by ``self.forward``, which calls the module's own
    forward first (accelerate's hooks do the same). Why not a wrapping module: a module's call costs
    ~2 us more than a function's and looking a child module up another ~1 us, times ~200 projections a
    step: on SmolLM2's gguf weights that was 5-7% of a one-client step with or without an adapter."""

    def __init__(self, base: nn.Module, bank: LoraBank, in_features: int, out_features: int) -> None:
        self.base = base
        self.base_forward = base.forward  # the module's own (bound) forward
        self.bank = bank
        self.in_features, self.out_features = in_features, out_features
        adapters, rank = bank.num_slots - 1, bank.max_rank
        dtype, device = bank.dtype, bank.device
        self.a_cat = torch.zeros(in_features, adapters * rank, dtype=dtype, device=device)  # [in, n * r]
        self.b_cat = torch.zeros(adapters * rank, out_features, dtype=dtype, device=device)  # [n * r, out]
        self.a_stack = self.a_cat.view(in_features, adapters, rank).permute(1, 0, 2)  # [n, in, r], a view
        self.b_stack = self.b_cat.view(adapters, rank, out_features)  # [n, r, out], a view
        # each adapter's A whole (the native kernel reads one adapter's rows in a run), where it runs
        self.a_rows = torch.zeros(adapters, in_features, rank, dtype=dtype, device=device) if bank.native else None
        # per slot, its adapter's (A [in, rank], B [rank, out]) views, None where it does not target this linear
        self.singles: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * bank.num_slots
        self.packed: tuple[torch.Tensor, torch.Tensor] | None = None  # oneDNN copies of A^T and B^T (CPU)
        self._pack()
        base.forward = self.forward  # an instance attribute: the module's call (and its hooks) reach it
        base.decoda_lora = self

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """The projection's output for ``hidden``, with the current step's deltas: the module's own call."""
        return self.base(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.base_forward(hidden)
        step = self.bank.current
        if step is None:
            return out
        if step.token_slots is not None:  # first: the one-client decode step, where every microsecond shows
            if step.single is not None and self.singles[step.single[0]] is None:
                return out
            add_deltas(out, hidden.contiguous(), self.a_rows, self.b_stack, step.token_slots,
                              self.bank.stack_scales)  # fmt: skip
            return out
        x = hidden.reshape(-1, self.in_features)
        if x.shape[0] != step.num_tokens:
            raise RuntimeError(f"LoRA step has {step.num_tokens} tokens, the linear got {x.shape[0]}")
        single = None
        if step.single is not None:
            single = self.singles[step.single[0]]
            if single is None:  # the adapter leaves this linear alone
                return out
        dtype = self.a_cat.dtype
        summed = out.reshape(-1, self.out_features)  # the base's own tensor: the delta goes in in place
        summed = summed if summed.dtype == dtype else summed.to(dtype)
        x = x if x.dtype == dtype else x.to(dtype)
        r = self.bank.max_rank
        if single is not None:
            add_single(summed, x, *single, step.single[1])
        elif step.padded is not None:
            first, last = step.adapters
            add_padded(summed, x, self.a_stack[first:last], self.b_stack[first:last], step.padded[0], step.mask,
                       *step.padded[1:])  # fmt: skip
        elif self.packed is not None:  # oneDNN, on request (LoraBank.use_product): every adapter
            add_stacked_onednn(summed, x, *self.packed, step.mask, r)
        else:
            first, last = step.adapters
            add_stacked(summed, x, self.a_cat[:, first * r : last * r], self.b_cat[first * r : last * r], step.mask, r)
        return summed.to(out.dtype).reshape(out.shape)

    def write(self, slot: int, matrices: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Put one adapter's ``(A [in, rank], B [rank, out])`` into ``slot`` (1.., None: zeros)."""
        if not 1 <= slot < self.bank.num_slots:
            raise ValueError(f"LoRA slot {slot} is not one of 1..{self.bank.num_slots - 1}")
        r, start = self.bank.max_rank, (slot - 1) * self.bank.max_rank
        self.a_cat[:, start : start + r].zero_()
        self.b_cat[start : start + r].zero_()
        if self.a_rows is not None:
            self.a_rows[slot - 1].zero_()
        self.singles[slot] = None
        if matrices is not None:
            a, b = matrices
            rank = a.shape[1]
            self.a_cat[:, start : start + rank].copy_(a)
            if self.a_rows is not None:
                self.a_rows[slot - 1, :, :rank].copy_(a)
            self.b_cat[start : start + rank].copy_(b)
            self.singles[slot] = (self.a_cat[:, start : start + rank], self.b_cat[start : start + rank])
        self._pack()

    def _pack(self) -> None:
        if self.bank.product == "onednn":
            self.packed = (pack_onednn(self.a_cat.t()), pack_onednn(self.b_cat.t()))

    def __repr__(self) -> str:
        return f"LoraLinear({self.base!r}, slots={self.bank.num_slots}, max_rank={self.bank.max_rank})"


def lora_of(module: nn.Module) -> LoraLinear | None:
    """The adapters a projection module carries (None: it is not wrapped)."""
    return getattr(module, "decoda_lora", None)


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
        self.native = serves(self.device, self.dtype)  # the kernel runs here (float32 on a CPU)
        self.product = "native" if self.native else "mm"  # use_product: the bench compares them
        self.scalings = [0.0] * self.num_slots
        self.stack_scales = torch.zeros(max_loras, dtype=self.dtype, device=self.device)  # by stack index
        self.current: LoraStep | None = None
        self.linears: dict[str, LoraLinear] = _wrap(model, self)

    @property
    def onednn(self) -> bool:
        return self.product == "onednn"

    def use_product(self, product: str) -> None:
        """``native`` (the default where it runs: ``low_rank.cpp``), ``mm`` (``torch.mm`` throughout) or
        ``onednn`` (the mixed steps' stacked product through oneDNN): the bench and tests compare them.
        A product that cannot run here falls back to ``mm``."""
        if product not in PRODUCTS:
            raise ValueError(f"LoRA product {product!r} is not one of {PRODUCTS}")
        runs = {"native": self.native, "mm": True, "onednn": uses_onednn(self.device, self.dtype)}
        self.product = product if runs[product] else "mm"
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
        self.stack_scales[slot - 1] = self.scalings[slot]

    def step_for(self, token_slots: list[int]) -> LoraStep | None:
        """The step of tokens whose adapters are ``token_slots`` (packed order); None when none has one."""
        used = set(token_slots) - {0}
        if not used:
            return None
        tokens = len(token_slots)
        single = None
        if len(used) == 1 and 0 not in token_slots:
            (slot,) = used
            single = (slot, self.scalings[slot])
        if self.product == "native" and (single is None or tokens <= NATIVE_SINGLE_TOKENS):
            stack = torch.tensor([slot - 1 for slot in token_slots], dtype=torch.long, device=self.device)
            return LoraStep(tokens, single=single, token_slots=stack)
        if single is not None:
            return LoraStep(tokens, single=single)
        first, last = (0, self.num_slots - 1) if self.onednn else (min(used) - 1, max(used))
        groups: dict[int, list[int]] = {slot: [] for slot in range(first + 1, last + 1)}
        for token, slot in enumerate(token_slots):
            if slot:
                groups[slot].append(token)
        width = max(len(group) for group in groups.values())
        if not self.onednn and tokens >= GROUPED_TOKENS and 2 * width <= tokens:
            return self._padded_step(tokens, first, last, groups, width)
        scales = [0.0] * (tokens * (last - first))
        for token, slot in enumerate(token_slots):
            if slot:
                scales[token * (last - first) + slot - 1 - first] = self.scalings[slot]
        mask = torch.tensor(scales, dtype=self.dtype, device=self.device).view(tokens, last - first, 1)
        return LoraStep(tokens, adapters=(first, last), mask=mask)

    def _padded_step(self, tokens: int, first: int, last: int, groups: dict[int, list[int]], width: int) -> LoraStep:
        """``product.add_padded``'s operands: each adapter's tokens in a row of ``width``, padded."""
        gather, scales, rows, owners = [], [], [], []
        for group, slot in enumerate(range(first + 1, last + 1)):
            members = groups[slot]
            gather += members + [0] * (width - len(members))
            scales += [self.scalings[slot]] * len(members) + [0.0] * (width - len(members))
            rows += range(group * width, group * width + len(members))
            owners += members
        as_index = lambda values: torch.tensor(values, dtype=torch.long, device=self.device)  # noqa: E731
        mask = torch.tensor(scales, dtype=self.dtype, device=self.device).view(last - first, width, 1)
        return LoraStep(tokens, adapters=(first, last), mask=mask, padded=(as_index(gather), as_index(rows),
                                                                            as_index(owners)))  # fmt: skip

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
                if child_name not in TARGET_NAMES or lora_of(child) is not None:
                    continue
                in_features, out_features = getattr(child, "in_features", None), getattr(child, "out_features", None)
                if not isinstance(in_features, int) or not isinstance(out_features, int):
                    continue  # not a linear (a fused MoE block named like one)
                wrapped[names[id(child)]] = LoraLinear(child, bank, in_features, out_features)
    if not wrapped:
        raise ValueError("LoRA adapters: the served model has no q/k/v/o or gate/up/down projections to adapt")
    return wrapped
