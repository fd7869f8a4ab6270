"""A tokenizer copied for another thread, without copying its read-only vocabulary.

A fast tokenizer's Rust object is not safe to share across threads (encoding with truncation or
padding changes its state), so the worker and the grammar compiler each get their own copy. A
``copy.deepcopy`` also copied the Python-side vocabulary and merges transformers 5 keeps beside it
(``_vocab``, ``_merges``: 151,936 and 151,387 entries for Qwen2.5, ~4 s a copy on a busy 2-core
machine, twice per start). Those are set once when the tokenizer is built and only read after, so
the copies share them; everything else, the Rust tokenizer included, is copied as before.
"""

from __future__ import annotations

import copy
from typing import TypeVar

T = TypeVar("T")
READ_ONLY = ("_vocab", "_merges")  # set in the tokenizer's __init__, never changed after


def thread_copy(tokenizer: T) -> T:
    """``copy.deepcopy(tokenizer)``, sharing ``READ_ONLY``."""
    shared = (getattr(tokenizer, name, None) for name in READ_ONLY)
    return copy.deepcopy(tokenizer, {id(value): value for value in shared if value is not None})
