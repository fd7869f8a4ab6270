"""Splitting a reasoning model's thinking from its answer (``--reasoning-parser``; vLLM's flag and names).

Reasoning models write their thinking between ``<think>`` and ``</think>`` before the answer. Every
peer server hands the thinking out apart (chat's ``reasoning_content``, the Responses API's
``reasoning`` item, the Messages API's ``thinking`` block), so the answer (``content``, tool calls)
never holds the tags or the thinking. The formats differ only in where the thinking starts:

- ``deepseek_r1``: the chat template already opened ``<think>`` in the prompt, so the reply starts
  inside the thinking and ``</think>`` ends it (a reply that repeats the opening tag first is read
  the same); a reply without ``</think>`` is all thinking (it was cut short while thinking).
- ``qwen3``: the thinking is one ``<think>…</think>`` block at the start of the reply (after any
  whitespace); a reply that does not open with it is all answer (Qwen3 with ``enable_thinking`` false).
- ``think``: the generic form: any number of ``<think>…</think>`` blocks at the start of the reply,
  whitespace between them.

The split is a state machine over the reply (``ReasoningStream``) that moves one way only: opening
(has the reply opened a block?) → thinking → between (the whitespace after ``</think>``, the
format's separator, not content; with ``think`` another block may open there) → answer. Once the
answer has started, it is the answer to the end: a ``<think>`` or ``</think>`` inside it (a JSON
string, a tool call's arguments, prose about the tags) is the answer's text, so a grammar-guaranteed
answer or a call is never cut, and the thinking can never follow the answer. The stream holds back
only text that may still become a tag (a tag split across deltas never leaks into either side); a
whole reply goes through the same stream, cut where its deltas were (``split_reply``), so a streamed
reply and its body always agree, token counts included. The split comes first: the tool-call parser
(``server.output.tool_parser``) only ever reads the answer.

Reasoning tokens (usage's ``reasoning_tokens``) are counted per engine delta, by where its text
went: a delta whose text falls inside the thinking, its tags and the separator after it is thinking;
the delta that starts the answer, and every one after, is answer; a delta with no text yet (held back
by the detokenizer) counts where the reply is; at the start of a ``qwen3``/``think`` reply, deltas
wait until the reply shows whether it opened a block. A delta is one token except where one step
commits several (accepted drafts), so the count is exact token by token but for the one step that
both ends the thinking and starts the answer, whose tokens count as answer.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"
NONE = "none"


@dataclass(frozen=True)
class ReasoningFormat:
    """Where a model's thinking is: ``opened_by_prompt`` (the reply starts inside it), else blocks
    the reply opens at its start: one, or as many as it likes when ``repeated``."""

    name: str
    opened_by_prompt: bool = False
    repeated: bool = False

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


FORMATS = {
    "deepseek_r1": ReasoningFormat("deepseek_r1", opened_by_prompt=True),
    "qwen3": ReasoningFormat("qwen3"),
    "think": ReasoningFormat("think", repeated=True),
}
PARSER_NAMES = (NONE, *FORMATS)


def check_reasoning_parser(name: str) -> None:
    if name != NONE and name not in FORMATS:
        raise ValueError(f"--reasoning-parser {name!r} is not known; choose from {', '.join(PARSER_NAMES)}")


def reasoning_format(name: str, thinking: bool = True) -> ReasoningFormat | None:
    """The format ``--reasoning-parser name`` reads (None: no split); ``thinking`` false (a request
    that turned the model's thinking off) makes the whole reply the answer."""
    return FORMATS.get(name) if thinking else None


# the states, in the only order a reply goes through them (see the module's docstring)
OPENING, THINKING, BETWEEN, ANSWER = "opening", "thinking", "between", "answer"


class ReasoningStream:
    """Feed text deltas; get (thinking, answer) to release for each, never a tag or part of one."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.format = fmt
        self.state = OPENING
        self._pending = ""  # text held back: a possible tag, or the whitespace after a block
        self._undecided = 0  # tokens fed while opening, counted once the reply shows what they were
        self.reasoning_tokens = 0

    @property
    def answering(self) -> bool:
        """The answer has started: everything from here on is answer."""
        return self.state == ANSWER

    def feed(self, text: str, num_tokens: int = 0) -> tuple[str, str]:
        """The thinking and the answer ``text`` releases; ``num_tokens``: the tokens it came from."""
        if self.state == ANSWER:  # the answer runs to the end: nothing to look for (nothing is held)
            return "", text
        self._pending += text
        self._undecided += num_tokens
        thinking, answer = "", ""
        while True:
            if self.state == OPENING:
                head = self._pending if self.format.opened_by_prompt else self._pending.lstrip()
                if len(head) < len(START) and START.startswith(head):  # may still become the opening tag
                    break
                if head.startswith(START):
                    self._pending, self.state = head[len(START) :], THINKING
                else:
                    self.state = THINKING if self.format.opened_by_prompt else ANSWER
                continue
            if self.state == THINKING:
                end = self._pending.find(END)
                if end < 0:
                    keep = _partial_tail(self._pending, END)
                    thinking += self._pending[: len(self._pending) - keep]
                    self._pending = self._pending[len(self._pending) - keep :]
                    break
                thinking += self._pending[:end]
                self._pending, self.state = self._pending[end + len(END) :], BETWEEN
                continue
            if self.state == BETWEEN:
                self._pending = self._pending.lstrip()  # the format's separator, not content
                if not self._pending:
                    break
                if self.format.repeated and len(self._pending) < len(START) and START.startswith(self._pending):
                    break  # may still open another block
                if self.format.repeated and self._pending.startswith(START):
                    self._pending, self.state = self._pending[len(START) :], THINKING
                else:
                    self.state = ANSWER
                continue
            answer, self._pending = self._pending, ""  # ANSWER: the rest is answer
            break
        self._count()
        return thinking, answer

    def _count(self) -> None:
        """Settle the tokens fed so far: thinking once the reply is inside a block or past one (its
        separator), answer once the answer started; undecided while the reply has not shown whether
        it opens a block (at its start, or a possible tag after a ``think`` block)."""
        if self.state == THINKING or (self.state == BETWEEN and not self._pending):
            self.reasoning_tokens += self._undecided
            self._undecided = 0
        elif self.state == ANSWER:
            self._undecided = 0

    def finish(self) -> tuple[str, str]:
        """The stream ended: what it held is thinking inside a block (or a deepseek_r1 reply that never
        left it); anything else held (a possible tag that never completed, whitespace) is answer."""
        rest, self._pending = self._pending, ""
        if self.state == THINKING or (self.state == OPENING and self.format.opened_by_prompt):
            self.state = THINKING
            self._count()
            return rest, ""
        if rest:
            self.state = ANSWER
        self._count()
        return "", rest


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that begins ``tag`` (held back: the next delta may finish it)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass(frozen=True)
class Split:
    """A whole reply split: its thinking (None when it did not think), its answer, the tokens thought."""

    thinking: str | None
    answer: str
    reasoning_tokens: int = 0


def split_reply(text: str, fmt: ReasoningFormat | None, pieces: list[tuple[int, int]] | None = None) -> Split:
    """The split of a whole reply by the streamed rules; ``pieces``: how its deltas cut it, as
    (characters, tokens) each (``server.output.collect``), so its reasoning tokens are counted as a
    stream counts them (without them, the reply is one delta of no tokens). ``fmt`` None: all answer."""
    if fmt is None:
        return Split(None, text)
    stream = fmt.stream()
    thinking, answer, start = [], [], 0
    for chars, tokens in pieces if pieces is not None else [(len(text), 0)]:
        more_thinking, more_answer = stream.feed(text[start : start + chars], tokens)
        thinking.append(more_thinking)
        answer.append(more_answer)
        start += chars
    more_thinking, more_answer = stream.feed(text[start:])  # text no piece covered (none when pieces are whole)
    last_thinking, last_answer = stream.finish()
    whole = "".join(thinking) + more_thinking + last_thinking
    return Split(whole or None, "".join(answer) + more_answer + last_answer, stream.reasoning_tokens)


def split_reasoning(text: str, fmt: ReasoningFormat | None) -> tuple[str | None, str]:
    """(the thinking, or None when there was none; the answer) of a whole reply (``split_reply``)."""
    split = split_reply(text, fmt)
    return split.thinking, split.answer


def thinking_block(thinking: str) -> dict[str, str]:
    """Anthropic's Messages API ``thinking`` content block (no signature: nothing here signs it)."""
    return {"type": "thinking", "thinking": thinking, "signature": ""}
