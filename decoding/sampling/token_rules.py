"""A request's token lists, built once into what each step reads in time independent of their length.

``bad_words_ids`` and ``sequence_bias`` act on the last token of a sequence when the history ends
with the rest (its prefix). Checking every sequence against the history at every step cost one
Python loop per sequence per row per step: a request with a thousand banned phrases and ``n: 64``
slowed every step of every user. Here the prefixes are stored in a trie read backwards (last token
first), so a step walks the history's tail once, at most the longest prefix deep, and collects
exactly the sequences whose prefix matched. One-token sequences have an empty prefix: a ban set
and a dense bias row built once. ``logit_bias`` and the suppress lists become tensors once.

Built per request (rows of one request share its ``GenerationParams``), not per step or per row:
``TokenRules.of`` keeps the last few.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import torch

from decoding.params import GenerationParams

_CACHE_SIZE = 8  # rows of one request are built together; a request's rows hold theirs after


class _Node:
    __slots__ = ("children", "entries")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.entries: list = []


class SuffixTrie:
    """Entries keyed by a token prefix, found by the prefixes a history ends with."""

    def __init__(self) -> None:
        self.root = _Node()
        self.depth = 0

    def add(self, prefix: list[int], entry: object) -> None:
        node = self.root
        for token in reversed(prefix):
            node = node.children.setdefault(token, _Node())
        node.entries.append(entry)
        self.depth = max(self.depth, len(prefix))

    def matches(self, history: list[int]) -> Iterator[object]:
        """Entries of every non-empty prefix that ``history`` ends with (a prefix longer than the
        history never matches, as HF's processors skip it)."""
        node = self.root
        for back in range(1, min(self.depth, len(history)) + 1):
            node = node.children.get(history[-back])
            if node is None:
                return
            yield from node.entries


class TokenRules:
    """What the sampling batch reads of one request's token lists, on one device."""

    def __init__(self, params: GenerationParams, vocab_size: int, device: torch.device) -> None:
        def ids(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        bias = params.logit_bias or {}
        self.logit_bias = (
            (ids([int(t) for t in bias]), torch.tensor([float(v) for v in bias.values()], device=device))
            if bias
            else None
        )
        self.suppress = ids(sorted(set(params.suppress_tokens))) if params.suppress_tokens else None
        begin = params.begin_suppress_tokens
        self.begin_suppress = ids(sorted(set(begin))) if begin else None
        # bad_words_ids: NoBadWordsLogitsProcessor
        self.bad_words_always: frozenset[int] = frozenset(w[0] for w in params.bad_words_ids or [] if len(w) == 1)
        self.bad_words = SuffixTrie()
        for words in params.bad_words_ids or []:
            if len(words) > 1:
                self.bad_words.add(words[:-1], words[-1])
        # sequence_bias: SequenceBiasLogitsProcessor, in HF's order of adding biases (one-token
        # sequences first, then longer ones grouped by length in order of first appearance)
        # HF adds a dense bias row; every token outside its entries gets 0, so only the entries are kept
        self.vocab_size = vocab_size
        self.sequence_bias = SuffixTrie()
        self._always_tokens: list[int] = []
        self._always_values = torch.zeros(0, dtype=torch.float32, device=device)
        if params.sequence_bias:
            always = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            for order, (token_ids, value) in enumerate(_hf_bias_order(params.sequence_bias)):
                if len(token_ids) == 1:
                    always[token_ids[0]] += float(value)
                else:
                    self.sequence_bias.add(list(token_ids[:-1]), (order, token_ids[-1], float(value)))
            tokens = always.nonzero().flatten()
            self._always_tokens, self._always_values = tokens.tolist(), always[tokens]

    def banned_bad_words(self, history: list[int]) -> set[int]:
        """Last tokens of ``bad_words_ids`` sequences whose prefix ends ``history``."""
        banned = set(self.bad_words_always)
        banned.update(self.bad_words.matches(history))
        return banned

    def sequence_bias_entries(self, history: list[int]) -> tuple[list[int], torch.Tensor]:
        """HF's bias for this history where it may be nonzero: distinct tokens and their float32 values,
        summed in HF's order (one-token sequences first, then the matched longer ones); every other
        token's bias is 0. A few entries instead of a ``[vocab]`` row for each row and step (hundreds of
        rows under a tool call's bias spent most of a step cloning and adding zeros)."""
        matches = sorted(self.sequence_bias.matches(history))
        if not matches:
            return self._always_tokens, self._always_values
        tokens = list(self._always_tokens)
        where = {token: i for i, token in enumerate(tokens)}
        for _, token, _ in matches:
            if token not in where:
                where[token] = len(tokens)
                tokens.append(token)
        values = torch.zeros(len(tokens), dtype=torch.float32, device=self._always_values.device)
        values[: len(self._always_tokens)] = self._always_values
        for _, token, value in matches:
            values[where[token]] += value
        return tokens, values

    def sequence_bias_row(self, history: list[int]) -> torch.Tensor:
        """``[vocab]`` float32: HF's bias for this history (zeros where none), summed in HF's order."""
        bias = torch.zeros(self.vocab_size, dtype=torch.float32, device=self._always_values.device)
        tokens, values = self.sequence_bias_entries(history)
        bias[tokens] = values
        return bias

    @classmethod
    def of(cls, params: GenerationParams, vocab_size: int, device: torch.device) -> TokenRules:
        """The request's rules, built on first use and shared by its rows."""
        key = (id(params), vocab_size, str(device))
        hit = _BUILT.get(key)
        if hit is not None and hit[0] is params:
            _BUILT.move_to_end(key)
            return hit[1]
        rules = cls(params, vocab_size, device)
        _BUILT[key] = (params, rules)
        while len(_BUILT) > _CACHE_SIZE:
            _BUILT.popitem(last=False)
        return rules


_BUILT: OrderedDict[tuple[int, int, str], tuple[GenerationParams, TokenRules]] = OrderedDict()


def _hf_bias_order(pairs: list) -> list:
    """HF's order of adding biases: one-token sequences first, then longer ones grouped by prefix length
    (groups in order of first appearance, list order within a group)."""
    longer = [p for p in pairs if len(p[0]) > 1]
    lengths = list(dict.fromkeys(len(p[0]) for p in longer))
    return [p for p in pairs if len(p[0]) == 1] + [p for n in lengths for p in longer if len(p[0]) == n]
