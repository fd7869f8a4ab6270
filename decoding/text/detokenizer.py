"""Token ids to text, one step at a time, without ever emitting half a character.

Decoding each new token on its own is wrong in two ways: a token's text can depend on its left
neighbour (SentencePiece drops the leading space of the first token of a decode call, WordPiece
glues ``##`` pieces, ``clean_up_tokenization_spaces`` rewrites `` .``), and a token can carry only
part of a UTF-8 character (byte-level BPE merges, ``<0xF0>`` byte-fallback pieces), which decodes
to U+FFFD until the rest arrives. Decoding everything every step is right but O(length) per step.

So we use the prefix/read-offset technique (as in vLLM's ``detokenize_incrementally`` and the
``tokenizers`` ``DecodeStream``): keep a short *window* of already-released tokens as context,
decode ``window + new tokens``, and release what the decode adds after the text the window
already accounts for. Cost per step is O(window + new tokens), not O(total length).

Holding back: text ending in a run of U+FFFD may be an incomplete character, so the whole
trailing run is held (byte-level BPE renders an incomplete tail as one U+FFFD; ``ByteFallback``
renders *every* byte of an invalid byte group as U+FFFD, and a half-finished character poisons
the whole group, so only "hold the entire run" is safe for both). What precedes the run is final
and is released. A U+FFFD that is followed by other text is a real invalid byte and is released
as ``tokenizer.decode`` would show it. ``flush()`` releases whatever is still held, incomplete or
not: only there can a U+FFFD for a never-completed character appear.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT_CHAR = "\ufffd"

# Tokens of prompt context decoded with the first new tokens. A few are enough: the context only
# has to fix the leading space / glue of the first generated token.
NUM_PROMPT_CONTEXT_TOKENS = 5

# A valid character needs at most 3 more bytes, so a real hold is a handful of tokens. Past this
# many unreleased tokens the run of U+FFFD is garbage (e.g. a model emitting stray byte tokens):
# release it rather than let the window, and the cost of every later step, grow without bound.
MAX_HELD_TOKENS = 32


class IncrementalDetokenizer:
    """Detokenizes one sequence incrementally; ``add`` returns only newly final text.

    Streaming every token through ``add`` and then calling ``flush`` yields exactly
    ``tokenizer.decode(generated_ids, skip_special_tokens=...)`` with the prompt's context applied
    to the first token (e.g. a SentencePiece ``▁Hello`` after a prompt keeps its space), except
    when the model emits invalid byte sequences, where U+FFFD placement may differ slightly.
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # Decode window: every token from _window_start on, whose first _num_context_chars
        # characters of decoded text are context or already released.
        self._window: list[int] = _clean_context(self._decode, list(prompt_ids))
        self._num_context_chars = len(self._decode(self._window))
        # Index in _window of the first token added since the window last moved.
        self._read_offset = len(self._window)
        self._chunks: list[str] = []
        self._finished = False

    @property
    def text(self) -> str:
        """All text released so far (by ``add`` and ``flush``)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def add(self, token_ids: list[int]) -> str:
        """Appends generated tokens; returns the text that became final (may be empty)."""
        if self._finished:
            raise RuntimeError("add() after flush(): the sequence is finished")
        if not token_ids:
            return ""
        self._window.extend(token_ids)
        decoded = self._decode(self._window)
        num_held = len(decoded) - len(decoded.rstrip(REPLACEMENT_CHAR))
        if num_held and len(self._window) - self._read_offset > MAX_HELD_TOKENS:
            num_held = 0
        stable_end = len(decoded) - num_held
        new_text = decoded[self._num_context_chars : stable_end]
        self._num_context_chars = max(self._num_context_chars, stable_end)
        if num_held == 0:
            self._advance_window()
        return self._release(new_text)

    def flush(self) -> str:
        """Releases everything still held (an incomplete character decodes to U+FFFD here)."""
        if self._finished:
            return ""
        self._finished = True
        return self._release(self._decode(self._window)[self._num_context_chars :])

    def token_text(self, token_id: int) -> str:
        """The display string of one token, for logprobs (see :func:`token_text`)."""
        return token_text(self.tokenizer, token_id)

    def _advance_window(self) -> None:
        """Keeps only the tokens of the latest release as context for the next step.

        The read offset is always at a character boundary (the window is only moved when the
        decode does not end in an incomplete character), so the kept tokens decode cleanly.
        """
        self._window = self._window[self._read_offset :]
        self._read_offset = len(self._window)
        self._num_context_chars = len(self._decode(self._window))

    def _release(self, text: str) -> str:
        if text:
            self._chunks.append(text)
        return text

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)


def _clean_context(decode: Any, prompt_ids: list[int]) -> list[int]:
    """The longest prompt tail (at most a few tokens) that decodes without U+FFFD.

    A tail starting in the middle of a character would decode to U+FFFD, and with
    ``ByteFallback`` that garbage could swallow the first generated bytes of the same group.
    """
    for start in range(max(len(prompt_ids) - NUM_PROMPT_CONTEXT_TOKENS, 0), len(prompt_ids)):
        if REPLACEMENT_CHAR not in decode(prompt_ids[start:]):
            return prompt_ids[start:]
    return []


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token as text for OpenAI logprobs: its decoded string, or ``bytes:\\xNN..`` when the
    token is only part of a UTF-8 character (OpenAI's convention for such tokens).

    Special tokens keep their names (``<|im_end|>``) so a logprob entry is never an empty string.
    """
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    if REPLACEMENT_CHAR not in text:
        return text
    raw = _token_bytes(tokenizer, token_id)
    if raw is None or raw.decode("utf-8", errors="replace") != text:
        return text  # the token really is U+FFFD, or an unknown scheme: keep the decode
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """Raw bytes of a byte-level BPE (GPT-2 alphabet) or a SentencePiece ``<0xNN>`` token."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str):
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    byte_of = _gpt2_byte_decoder()
    if all(ch in byte_of for ch in piece):
        return bytes(byte_of[ch] for ch in piece)
    return None


_BYTE_DECODER: dict[str, int] = {}


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-character map, inverted (character -> byte).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to U+0100 on,
    in byte order. Byte-level BPE vocabularies (GPT-2, SmolLM2, Llama 3, Qwen) spell tokens in it.
    """
    if not _BYTE_DECODER:
        printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
        shifted = [b for b in range(256) if b not in printable]
        _BYTE_DECODER.update({chr(b): b for b in printable})
        _BYTE_DECODER.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return _BYTE_DECODER
