"""Incremental detokenization, stop strings and the streamer, with real tokenizers.

SmolLM2's tokenizer (byte-level BPE, the embedded model's) comes from the conftest fixture; a tiny
SentencePiece-style tokenizer (byte fallback, ``▁`` spaces, leading-space strip, like Llama 2's)
is built in memory, so both families of context effects are covered without files or network.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from decoding.text.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, token_text
from decoding.text.stop import StopStringMatcher
from decoding.text.streamer import DeltaStreamer

TEXTS = {
    "ascii": "Hello, world! The quick brown fox jumps over the lazy dog.",
    "emoji": "Party time 😀🎉👍🏽 and a family 👨‍👩‍👧 emoji.",
    "cjk": "你好，世界！日本語のテキスト。한국어 텍스트입니다.",
    "mixed": "Ünïcödé café — naïve résumé; Ελληνικά, русский, עברית, العربية 🚀 ok",
    "whitespace": "  leading spaces\n\nnew lines\tand\ttabs   trailing  \n  indented\r\nend ",
    "code": "def f(x):\n    return {'a': [1, 2, 3]}  # comment 😀\n",
}


def stream(tokenizer, prompt_ids, ids, chunk_size=1, skip_special_tokens=True):
    """Feeds ids in chunks; returns the chunks returned by add() and the flushed tail."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
    chunks = [detok.add(ids[i : i + chunk_size]) for i in range(0, len(ids), chunk_size)]
    tail = detok.flush()
    assert detok.text == "".join(chunks) + tail
    return chunks, tail


@pytest.fixture(scope="module")
def chat_prompt_ids(smollm2_tokenizer):
    return smollm2_tokenizer.encode("<|im_start|>user\nSay something<|im_end|>\n<|im_start|>assistant\n")


# ---- byte-level BPE (SmolLM2) -----------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7])
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_streaming_equals_full_decode(smollm2_tokenizer, chat_prompt_ids, name, chunk_size):
    ids = smollm2_tokenizer.encode(TEXTS[name], add_special_tokens=False)
    chunks, tail = stream(smollm2_tokenizer, chat_prompt_ids, ids, chunk_size)
    assert "".join(chunks) + tail == smollm2_tokenizer.decode(ids, skip_special_tokens=True) == TEXTS[name]
    assert tail == ""
    assert not any(REPLACEMENT_CHAR in chunk for chunk in chunks)


@pytest.mark.parametrize("prompt", [[], "last"])
def test_streaming_without_prompt_context(smollm2_tokenizer, prompt):
    ids = smollm2_tokenizer.encode(TEXTS["mixed"], add_special_tokens=False)
    prompt_ids = [] if prompt == [] else smollm2_tokenizer.encode("Hi", add_special_tokens=False)
    chunks, tail = stream(smollm2_tokenizer, prompt_ids, ids)
    assert "".join(chunks) + tail == TEXTS["mixed"]


def test_emoji_split_across_byte_tokens_never_yields_replacement_char(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("a😀b🎉", add_special_tokens=False)
    # the emoji really is split: some of its tokens decode alone to U+FFFD
    assert sum(REPLACEMENT_CHAR in smollm2_tokenizer.decode([i]) for i in ids) >= 2
    chunks, _ = stream(smollm2_tokenizer, [], ids)
    assert chunks[0] == "a"
    assert "".join(chunks) == "a😀b🎉"
    assert "" in chunks  # held while incomplete
    assert not any(REPLACEMENT_CHAR in chunk for chunk in chunks)


def test_incomplete_character_is_flushed_at_the_end(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 😀", add_special_tokens=False)
    emoji_ids = smollm2_tokenizer.encode("😀", add_special_tokens=False)
    assert len(emoji_ids) > 1
    chunks, tail = stream(smollm2_tokenizer, [], ids[:-1])
    assert not any(REPLACEMENT_CHAR in chunk for chunk in chunks)
    assert REPLACEMENT_CHAR in tail
    assert "".join(chunks) + tail == smollm2_tokenizer.decode(ids[:-1])


def test_invalid_bytes_followed_by_text_match_decode(smollm2_tokenizer):
    emoji_ids = smollm2_tokenizer.encode("😀", add_special_tokens=False)
    ids = [emoji_ids[-1], *smollm2_tokenizer.encode(" fine", add_special_tokens=False)]  # a lone tail byte
    chunks, tail = stream(smollm2_tokenizer, [], ids)
    assert "".join(chunks) + tail == smollm2_tokenizer.decode(ids)
    assert "".join(chunks).startswith(REPLACEMENT_CHAR)


def test_garbage_bytes_do_not_grow_the_window(smollm2_tokenizer):
    lone_tail = smollm2_tokenizer.encode("😀", add_special_tokens=False)[-1]
    counting = CountingTokenizer(smollm2_tokenizer)
    detok = IncrementalDetokenizer(counting, [])
    released = "".join(detok.add([lone_tail]) for _ in range(200)) + detok.flush()
    assert released == smollm2_tokenizer.decode([lone_tail] * 200)
    assert max(counting.lengths) <= 2 * 33


def test_cost_per_step_does_not_grow_with_length(smollm2_tokenizer, chat_prompt_ids):
    counting = CountingTokenizer(smollm2_tokenizer)
    ids = smollm2_tokenizer.encode(" ".join(TEXTS.values()) * 20, add_special_tokens=False)
    assert len(ids) > 1000
    detok = IncrementalDetokenizer(counting, chat_prompt_ids)
    counting.lengths.clear()
    for token in ids:
        detok.add([token])
    assert detok.text + detok.flush() == smollm2_tokenizer.decode(ids)
    assert max(counting.lengths) <= 8
    assert len(counting.lengths) <= 2 * len(ids)


def test_skip_special_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = [*tok.encode("Done.", add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    ids += tok.encode(" More", add_special_tokens=False)
    chunks, tail = stream(tok, [], ids, skip_special_tokens=True)
    assert "".join(chunks) + tail == "Done. More"
    chunks, tail = stream(tok, [], ids, skip_special_tokens=False)
    assert "".join(chunks) + tail == "Done.<|im_end|> More" == tok.decode(ids)


def test_token_text(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert token_text(tok, tok.encode(" hello", add_special_tokens=False)[0]) == " hello"
    assert token_text(tok, tok.convert_tokens_to_ids("<|im_end|>")) == "<|im_end|>"
    emoji_ids = tok.encode("😀", add_special_tokens=False)
    pieces = [token_text(tok, i) for i in emoji_ids]
    assert all(p.startswith("bytes:\\x") for p in pieces)
    raw = b"".join(bytes(int(h, 16) for h in p[len("bytes:") :].split("\\x")[1:]) for p in pieces)
    assert raw.decode() == "😀"
    assert IncrementalDetokenizer(tok, []).token_text(emoji_ids[0]) == pieces[0]


# ---- SentencePiece-style (byte fallback, ▁ spaces) -----------------------------------------------------
@pytest.fixture(scope="module")
def sp_tokenizer():
    """A tiny Llama-2-style tokenizer: chars + ``▁x`` merges, everything else as ``<0xNN>`` bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    letters = "abcdefghijklmnopqrstuvwxyzHW"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["▁", *letters, *",.!\n", *("▁" + c for c in letters)]:
        vocab.setdefault(piece, len(vocab))
    model = models.BPE(
        vocab=vocab, merges=[("▁", c) for c in letters], unk_token="<unk>", byte_fallback=True, fuse_unk=True
    )
    backend = Tokenizer(model)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


SP_TEXTS = ["Hello world", "Hello world 你好 😀!", "a你好b\n\nWow 👍🏽 ok", "你好你好"]


@pytest.mark.parametrize("chunk_size", [1, 2, 5])
@pytest.mark.parametrize("text", SP_TEXTS)
def test_sentencepiece_streaming_equals_full_decode(sp_tokenizer, text, chunk_size):
    ids = sp_tokenizer.encode(text, add_special_tokens=False)
    assert sp_tokenizer.decode(ids) == text
    chunks, tail = stream(sp_tokenizer, [sp_tokenizer.bos_token_id], ids, chunk_size)
    assert "".join(chunks) + tail == text
    assert not any(REPLACEMENT_CHAR in chunk for chunk in chunks)


def test_sentencepiece_leading_space_uses_prompt_context(sp_tokenizer):
    prompt_ids = sp_tokenizer.encode("Hi", add_special_tokens=False)
    ids = sp_tokenizer.encode("world", add_special_tokens=False)  # "▁w", "o", ...
    assert sp_tokenizer.decode(ids) == "world"  # alone, the leading space is stripped
    chunks, _ = stream(sp_tokenizer, prompt_ids, ids)
    assert "".join(chunks) == " world"  # after the prompt it is a new word


def test_sentencepiece_byte_group_poisoned_by_partial_char_is_held(sp_tokenizer):
    # ByteFallback renders a whole byte group as U+FFFDs while its last character is incomplete,
    # even the characters of the group that were already complete (and released).
    ids = sp_tokenizer.encode("你好", add_special_tokens=False)
    assert REPLACEMENT_CHAR * 4 in sp_tokenizer.decode(ids[:5])
    chunks, tail = stream(sp_tokenizer, [sp_tokenizer.bos_token_id], ids)
    assert [c for c in chunks if c] == ["你", "好"]
    assert tail == ""


# ---- stop strings ----------------------------------------------------------------------------------
def run_matcher(stop, pieces):
    matcher = StopStringMatcher(stop)
    released, matched = [], None
    for piece in pieces:
        text, found = matcher.push(piece)
        released.append(text)
        matched = matched or found
    released.append(matcher.flush())
    return released, matched


def test_stop_string_split_across_pushes_never_leaks():
    released, matched = run_matcher(["STOP"], ["Hello S", "T", "O", "P and more", " after"])
    assert released == ["Hello ", "", "", "", "", ""]
    assert matched == "STOP"


def test_stop_string_at_the_very_start():
    assert run_matcher(["<end>"], ["<e", "nd>rest"]) == (["", "", ""], "<end>")
    assert run_matcher(["x"], ["x"]) == (["", ""], "x")


def test_stop_prefix_of_another_stop_completes_first():
    # "ab" and "abc" start together; "ab" completes first and wins
    assert run_matcher(["abc", "ab"], ["xa", "bc"])[0] == ["x", "", ""]
    assert run_matcher(["abc", "ab"], ["xa", "bc"])[1] == "ab"


def test_stops_ending_together_prefer_the_earliest_start():
    assert run_matcher(["bc", "abc"], ["xabc"]) == (["x", ""], "abc")


def test_stop_completing_first_wins_over_earlier_start():
    assert run_matcher(["abcd", "bc"], ["xabcd"]) == (["xa", ""], "bc")


def test_earliest_stop_in_the_text_wins():
    assert run_matcher(["two", "one"], ["zero one two"]) == (["zero ", ""], "one")


def test_result_does_not_depend_on_chunking():
    rng = random.Random(0)
    stop = ["ab", "abc", "bcd", "cab", "dd"]
    text = "xxcabcdabdd"
    full = run_matcher(stop, [text])
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 5)))
        pieces = [text[i:j] for i, j in itertools.pairwise([0, *cuts, len(text)])]
        released, matched = run_matcher(stop, pieces)
        assert ("".join(released), matched) == ("".join(full[0]), full[1])


def test_held_prefix_that_never_completes_is_released_on_flush():
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.push("the end </ans") == ("the end ", None)
    assert matcher.held == "</ans"
    assert matcher.push("w") == ("", None)
    assert matcher.push("x") == ("</answx", None)  # no longer a possible prefix
    assert matcher.push("</") == ("", None)
    assert matcher.flush() == "</"


def test_no_stop_strings_releases_everything():
    assert run_matcher([], ["a", "b"]) == (["a", "b", ""], None)
    assert run_matcher([""], ["a"]) == (["a", ""], None)


def test_nothing_released_after_a_match():
    matcher = StopStringMatcher(["."])
    assert matcher.push("Hi. there") == ("Hi", ".")
    assert matcher.push("more.") == ("", None)
    assert matcher.flush() == ""


# ---- the streamer --------------------------------------------------------------------------------
def test_streamer_stops_on_stop_string_split_across_tokens(smollm2_tokenizer, chat_prompt_ids):
    tok = smollm2_tokenizer
    ids = tok.encode("The answer is 42. Observation: done", add_special_tokens=False)
    seen = []
    streamer = DeltaStreamer(tok, chat_prompt_ids, stop=["Observation:"], on_text=seen.append)
    taken = []
    for token in ids:
        streamer.put(token)
        taken.append(streamer.take())
        assert "Obs" not in "".join(taken)
    assert streamer.stopped and streamer.stop_reason == "Observation:"
    streamer.put([tok.encode(" more", add_special_tokens=False)[0]])
    streamer.end()
    taken.append(streamer.take())
    assert "".join(taken) == "".join(seen) == streamer.text == "The answer is 42. "


def test_streamer_end_releases_held_prefix_and_incomplete_char(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("Hi 😀 </ans", add_special_tokens=False)
    streamer = DeltaStreamer(tok, [], stop=["</answer>"])
    for token in ids:
        streamer.put(token)
    assert streamer.take() == "Hi 😀 "
    streamer.end()
    streamer.end()  # idempotent
    assert streamer.take() == "</ans"
    assert not streamer.stopped and streamer.stop_reason is None


def test_streamer_accepts_tensors_and_skips_hf_prompt(smollm2_tokenizer, chat_prompt_ids):
    tok = smollm2_tokenizer
    ids = tok.encode("Tensor input 你好", add_special_tokens=False)
    streamer = DeltaStreamer(tok, chat_prompt_ids, skip_prompt=True)
    streamer.put(torch.tensor([chat_prompt_ids]))  # HF generate() puts the prompt first, as [1, n]
    streamer.put(torch.tensor(ids[:2]))
    for token in ids[2:]:
        streamer.put(torch.tensor(token))
    streamer.end()
    assert streamer.take() == "Tensor input 你好"
    with pytest.raises(ValueError, match="batch"):
        DeltaStreamer(tok, []).put(torch.tensor([[1, 2], [3, 4]]))


def test_streamer_skip_special_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = [*tok.encode("a", add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    kept = DeltaStreamer(tok, [], skip_special_tokens=False)
    dropped = DeltaStreamer(tok, [])
    for streamer in (kept, dropped):
        streamer.put(ids)
        streamer.end()
    assert (kept.take(), dropped.take()) == ("a<|im_end|>", "a")


class CountingTokenizer:
    """Wraps a tokenizer and records how many ids each decode call got."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.lengths: list[int] = []

    def decode(self, ids, **kwargs):
        self.lengths.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)
