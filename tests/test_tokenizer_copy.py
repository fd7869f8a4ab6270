"""The worker's and the grammar compiler's tokenizer copies: each its own Rust tokenizer (not safe to
share across threads), the read-only vocabulary and merges shared rather than copied (a deepcopy took
~4 s of each Qwen2.5 start on the busy 2-core machine, twice)."""

from __future__ import annotations

from transformers import AutoTokenizer

from decoding.model.gguf_metadata import write_metadata
from decoding.text.tokenizer_copy import thread_copy
from tests.tiny_gguf import write_tiny_gguf


def test_a_thread_copy_shares_only_the_read_only_vocabulary(tmp_path):
    write_metadata(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "meta")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "meta"))
    copied = thread_copy(tokenizer)
    assert copied._vocab is tokenizer._vocab and copied._merges is tokenizer._merges
    assert copied._tokenizer is not tokenizer._tokenizer and copied.init_kwargs is not tokenizer.init_kwargs
    text = "Ġthe weather in <|im_end|>"
    assert copied(text).input_ids == tokenizer(text).input_ids
    copied._tokenizer.enable_truncation(max_length=2)  # state one thread sets never reaches the other
    assert copied._tokenizer.truncation["max_length"] == 2 and tokenizer._tokenizer.truncation is None
