"""A speculative request's acceptance rate reaches its client (the playground shows it per reply):
the engine counts each request's drafts, and the response reports them in OpenAI's own usage
fields, ``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from openai.types import CompletionUsage

from decoding import GenerationParams, RequestOutput
from tests.engine_harness import EngineHarness, tiny_llama
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, post, run, sse_payloads
from tests.test_engine_speculative import EOS, VOCAB, Counting, prompts


class DraftingEngine(FakeEngineClient):
    """Reports drafts as a speculative request does: running totals on every output (4 drafted and
    3 accepted per step)."""

    async def _run(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        steps = 0
        async for output in super()._run(request_id, prompt_ids, params):
            steps += 1
            output.num_draft_tokens, output.num_accepted_draft_tokens = 4 * steps, 3 * steps
            yield output


def details(usage: dict) -> tuple[int, int]:
    parsed = CompletionUsage.model_validate(usage).completion_tokens_details  # the openai client's own model
    return parsed.accepted_prediction_tokens, parsed.rejected_prediction_tokens


def test_a_body_reports_accepted_and_rejected_drafts():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
            "prompt_lookup_num_tokens": 3}  # fmt: skip
    usage = run(post(DraftingEngine(), "/v1/chat/completions", body)).json()["usage"]
    assert details(usage) == (15, 5)
    assert usage["completion_tokens"] == 5  # drafts the target rejected are not output tokens


def test_several_prompts_add_up():
    body = {"model": MODEL, "prompt": ["hello", "world"], "max_tokens": 2, "prompt_lookup_num_tokens": 3}
    usage = run(post(DraftingEngine(), "/v1/completions", body)).json()["usage"]
    assert details(usage) == (12, 4)


def test_the_stream_usage_chunk_reports_them():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}, "prompt_lookup_num_tokens": 3}  # fmt: skip
    events = sse_payloads(run(post(DraftingEngine(), "/v1/chat/completions", body)).text)
    usage = [e["usage"] for e in events if e != "[DONE]" and e["usage"]]
    assert len(usage) == 1 and details(usage[0]) == (9, 3)


def test_a_request_that_drafted_nothing_has_plain_usage():
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    usage = run(post(FakeEngineClient(), "/v1/completions", body)).json()["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_the_engine_counts_each_request_s_drafts(smollm2_tokenizer):
    """The per-request totals equal what the engine reported to its metrics, request by request."""
    h = EngineHarness(tiny_llama(VOCAB, seed=3, num_layers=4), smollm2_tokenizer, [EOS])
    totals = {}
    for i, prompt in enumerate(prompts(3)):
        counting = Counting()
        h.engine.ctx.observer = counting
        h.add(f"spec{i}", prompt, GenerationParams(max_new_tokens=24, prompt_lookup_num_tokens=4))
        h.run()
        last = h.outputs[f"spec{i}"][-1]
        assert last.finished
        totals[i] = (last.num_draft_tokens, last.num_accepted_draft_tokens)
        assert totals[i] == (counting.drafted.get("prompt_lookup", 0), counting.accepted.get("prompt_lookup", 0))
    assert any(drafted for drafted, _ in totals.values())  # repeated prompts: lookup finds drafts
    h.add("plain", prompts(1)[0], GenerationParams(max_new_tokens=8))
    h.run()
    assert h.outputs["plain"][-1].num_draft_tokens == 0
