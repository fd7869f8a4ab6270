"""``/v1/completions`` output: ``text`` choices, the legacy logprobs format, ``echo``.

The choice index of a completion with several prompts is ``prompt_index * n + index``, as OpenAI
numbers them.
"""

from __future__ import annotations

from decoding import RequestOutput
from server.output.collect import ChoiceState, Collected
from server.output.envelope import Envelope
from server.output.logprobs import completion_logprobs


class CompletionFormat(Envelope):
    """``/v1/completions``: ``text`` choices, the legacy logprobs format, ``echo``."""

    object_name = chunk_object = "text_completion"

    def __init__(self, request_id: str, model: str, n: int, *, echo_texts: list[str] | None = None,
                 logprobs: bool = False, **options: bool) -> None:  # fmt: skip
        super().__init__(request_id, model, n, **options)
        self.echo_texts = echo_texts  # each prompt's text, prepended to its choices when echo is on
        self.logprobs = logprobs
        self._echoed: set[tuple[int, int]] = set()

    def chunks(self, prompt_index: int, output: RequestOutput) -> list[dict]:
        self._count(prompt_index, output)
        chunks = []
        for delta in output.deltas:
            text = delta.text
            if self.echo_texts is not None and (prompt_index, delta.index) not in self._echoed:
                self._echoed.add((prompt_index, delta.index))
                text = self.echo_texts[prompt_index] + text
            choice = {
                "index": prompt_index * self.n + delta.index,
                "text": text,
                "logprobs": completion_logprobs(delta.logprobs, 0) if delta.logprobs is not None else None,
                "finish_reason": delta.finish_reason.value if delta.finish_reason else None,
            }
            chunks.append(self._chunk([self._extend(choice, delta.token_ids, delta.sequence_score)]))
        return chunks

    def body(self, results: list[Collected]) -> dict:
        choices = []
        for prompt_index, collected in enumerate(results):
            for index in range(self.n):
                state = collected.choices.get(index) or ChoiceState(index, finish_reason="length")
                entries = state.logprobs
                text = state.text
                if self.echo_texts is not None:
                    entries = (collected.prompt_logprobs or []) + entries
                    text = self.echo_texts[prompt_index] + text
                choice = {
                    "index": prompt_index * self.n + index,
                    "text": text,
                    "logprobs": completion_logprobs(entries, 0) if self.logprobs else None,
                    "finish_reason": state.finish_reason,
                }
                choices.append(self._extend(choice, state.token_ids, state.sequence_score))
        return self._body(choices, results)
