"""``--max-prefill-share``: prompt work (prefill chunks, the vision tower) held to a share of the time while
rows decode, so running streams keep their pace on a CPU while long prompts and images arrive.

The share is a credit (``decoding/engine/prefill_share.py``); these tests drive it directly where they
check what a step carries (timing on this machine is not what they assert), and check that whatever the
share holds back, every request's tokens are still ``generate()``'s.
"""

from __future__ import annotations

import pytest
import torch

from decoding.engine.prefill_share import CREDIT_BOUND_SECONDS, PrefillShare
from decoding.params import GenerationParams
from server.config.settings import Settings
from tests import vlm_families as vf
from tests.engine_harness import EngineHarness, tiny_llama
from tests.test_engine_vision import Served

GREEDY = dict(do_sample=False, ignore_eos=True)


def test_a_share_of_one_never_limits():
    share = PrefillShare(1.0)
    share.record(10.0, prompt_tokens=500, decode_tokens=1)
    assert not share.limited(16)


def test_prompt_work_over_its_share_is_limited_until_decode_steps_pay_it_back():
    share = PrefillShare(0.25)
    share.record(1.0, prompt_tokens=300, decode_tokens=100)  # 0.75 s of prompt work, 0.25 s earned
    assert share.credit == pytest.approx(-0.5)
    assert share.limited(1) and not share.limited(0)  # a step without decode rows is never limited
    for _ in range(3):
        share.record(0.5, prompt_tokens=0, decode_tokens=16)  # each earns 0.125 s
        assert share.limited(16)
    share.record(0.5, prompt_tokens=0, decode_tokens=16)
    assert not share.limited(16)


def test_the_vision_tower_counts_whole_and_the_credit_is_bounded():
    share = PrefillShare(0.5)
    share.record(3.0, prompt_tokens=0, decode_tokens=8, vision_seconds=2.0)  # 2 s tower, earned 1.5 s
    assert share.credit == pytest.approx(-0.5)
    share.record(60.0, prompt_tokens=10_000, decode_tokens=1)
    assert share.credit == -CREDIT_BOUND_SECONDS
    for _ in range(1000):
        share.record(1.0, prompt_tokens=0, decode_tokens=4)
    assert share.credit == CREDIT_BOUND_SECONDS
    share.record(5.0, prompt_tokens=100, decode_tokens=0)  # no decode rows: not booked
    assert share.credit == CREDIT_BOUND_SECONDS


@pytest.mark.parametrize("value", [0, -0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused_at_start(value):
    with pytest.raises(ValueError, match="max_prefill_share"):
        Settings(max_prefill_share=value).check()
    with pytest.raises(ValueError, match="max_prefill_share"):
        PrefillShare(value)


def _decoding(harness: EngineHarness, request_id: str) -> None:
    """Step until the request's prompt is in and it decodes."""
    while not harness.engine.strategies[request_id].request.prefill_done:
        harness.engine.step()


def test_over_its_share_a_long_prompt_trickles_in_and_the_tokens_are_unchanged(smollm2_tokenizer):
    model = tiny_llama(64)
    long_prompt = [(7 * i) % 60 + 2 for i in range(120)]
    results = {}
    for share in (1.0, 0.2):
        harness = EngineHarness(model, smollm2_tokenizer, [1], max_prefill_share=share)
        with torch.inference_mode():
            harness.add("streaming", [3, 4, 5], GenerationParams(max_new_tokens=40, **GREEDY))
            _decoding(harness, "streaming")
            harness.engine.scheduler.prefill_share.credit = -1.0  # as after a long prompt's steps
            harness.add("long", long_prompt, GenerationParams(max_new_tokens=8, **GREEDY))
            harness.engine.step()
            fed = harness.engine.strategies["long"].request.num_prefilled
            assert fed == (120 if share == 1.0 else 1)  # the trickle: as many prompt tokens as decode tokens
        harness.run()
        results[share] = {rid: harness.token_ids(rid) for rid in harness.outputs}
    assert results[0.2] == results[1.0] and len(results[0.2]["long"]) == 8


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Served:
    family = vf.BY_NAME["llava"]
    return Served(family, str(family.save(tmp_path_factory.mktemp("llava"))))


def _text_prompt(llava: Served) -> list[int]:
    return llava.prompter.prompt(llava.messages("Only words.", 0), [], chat_template=None, tools=None,
                                 add_generation_prompt=True, template_kwargs=None)  # fmt: skip


def test_over_its_share_no_vision_tower_runs_and_the_image_waits_its_turn(llava):
    harness = llava.harness(max_prefill_share=0.2)
    text = _text_prompt(llava)
    image = llava.prompt("Describe it.", [3])
    first_image_token = int(image.media.positions[0])
    with torch.inference_mode():
        harness.add("text", list(text), GenerationParams(max_new_tokens=24, **GREEDY))
        _decoding(harness, "text")
        harness.engine.scheduler.prefill_share.credit = -1.0
        params = GenerationParams(max_new_tokens=10, do_sample=False)
        harness.add("image", list(image), params, image_prompt=image.media)
        request = harness.engine.strategies["image"].request
        for _ in range(first_image_token + 2):
            harness.engine.step()
            assert request.image_prompt.features is None  # the tower never ran
            assert request.num_prefilled <= first_image_token  # the text before the image trickled in
        assert request.num_prefilled == first_image_token
        harness.engine.scheduler.prefill_share.credit = 1.0  # its turn
        harness.engine.step()
        assert request.num_prefilled > first_image_token
    harness.run()
    assert harness.token_ids("image") == llava.reference("Describe it.", [3], "greedy")[0]


def test_beside_decoding_rows_one_request_a_step_goes_through_the_vision_tower(llava):
    """Two images waiting with credit to spare: the first step takes one through the tower, the other
    waits for the credit it leaves (one step's lump of several images would outrun the bounded debt)."""
    harness = llava.harness(max_prefill_share=0.2)
    text = _text_prompt(llava)
    with torch.inference_mode():
        harness.add("text", list(text), GenerationParams(max_new_tokens=40, **GREEDY))
        _decoding(harness, "text")
        harness.engine.scheduler.prefill_share.credit = 1.0
        for k, seed in enumerate((3, 4)):
            image = llava.prompt("Describe it.", [seed])
            harness.add(f"image{k}", list(image), GenerationParams(max_new_tokens=10, do_sample=False),
                        image_prompt=image.media)  # fmt: skip
        requests = [harness.engine.strategies[f"image{k}"].request for k in range(2)]
        firsts = [int(request.image_prompt.positions[0]) for request in requests]
        harness.engine.step()
        assert requests[0].num_prefilled > firsts[0]  # its image went through the tower
        assert requests[1].num_prefilled <= firsts[1] and requests[1].image_prompt.features is None
    harness.run()
    for k, seed in enumerate((3, 4)):
        assert harness.token_ids(f"image{k}") == llava.reference("Describe it.", [seed], "greedy")[0]
