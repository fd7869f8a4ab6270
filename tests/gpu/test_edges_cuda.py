"""Issue 50/51's engine pieces on a CUDA device: a row no token can be picked from fails its request
alone (a 400, the neighbours' tokens as alone), and a thinking budget forces the end tag's ids at
the budget, under greedy, seeded sampling and beams. Their CPU twins: tests/test_nonfinite_rows.py,
tests/test_thinking_budget.py."""

from __future__ import annotations

import pytest

from decoding.params import GenerationParams
from decoding.sampling.nucleus import SORT_BELOW
from tests.engine_harness import EngineHarness, tiny_llama
from tests.gpu.device import DEVICE

LARGE = SORT_BELOW * 2
END_IDS = [11, 12, 13]


class _Letters:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + i % 26) for i in ids)


def test_a_row_banning_every_token_fails_alone_on_cuda():
    model = tiny_llama(LARGE, seed=4).to(DEVICE)
    prompt = [5, 6, 7, 8]
    seeded = GenerationParams(max_new_tokens=4, do_sample=True, top_p=0.9, seed=3, ignore_eos=True)
    greedy = GenerationParams(max_new_tokens=4, ignore_eos=True)
    banned = GenerationParams(max_new_tokens=4, do_sample=True, top_p=0.9, suppress_tokens=list(range(LARGE)))
    alone = EngineHarness(model, _Letters(), [0], device=DEVICE)
    alone.add("seeded", prompt, seeded)
    alone.add("greedy", prompt, greedy)
    alone.run()
    crowd = EngineHarness(model, _Letters(), [0], device=DEVICE)
    crowd.add("seeded", prompt, seeded)
    crowd.add("banned", prompt, banned)
    crowd.add("greedy", prompt, greedy)
    crowd.run()
    (last,) = [out for out in crowd.outputs["banned"] if out.finished]
    assert last.error_code == "invalid_request" and "no token can be picked" in last.error
    assert crowd.token_ids("seeded") == alone.token_ids("seeded")
    assert crowd.token_ids("greedy") == alone.token_ids("greedy")


KNOBS = {"greedy": {}, "seeded": {"do_sample": True, "seed": 5}, "beam": {"num_beams": 2}}


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_a_thinking_budget_forces_the_end_tag_on_cuda(knobs):
    model = tiny_llama(256, seed=2).to(DEVICE)
    params = GenerationParams(max_new_tokens=10, ignore_eos=True, thinking_budget=3, thinking_end_ids=END_IDS, **knobs)
    harness = EngineHarness(model, _Letters(), [0], device=DEVICE)
    harness.add("r", [5, 6, 7, 8], params)
    harness.run()
    tokens = harness.token_ids("r")
    ended = next((i for i in range(len(tokens) - 2) if tokens[i : i + 3] == END_IDS), None)
    assert ended is not None and ended <= 3, tokens
