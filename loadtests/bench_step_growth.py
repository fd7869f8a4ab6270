"""Does a step cost more late in a long generation? It must not (issue: no per-step work
proportional to the whole history).

Tiny random models keep the forward at a millisecond, so anything the engine does per step that
grows with the generated length shows up. For each case one request generates 2,100 forced tokens
through the engine; the table prints the median step time around 100 and around 2,000 generated
tokens, and their ratio (about 1.0 when nothing grows with the history; the attention's own
growth over 2,000 positions is part of it, see the greedy row). Universal assisted decoding is
timed by its drafting stage (the re-encoding lives there), on the rounds that drafted.

    .venv/bin/python -m loadtests.bench_step_growth [--tokens 2100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from decoding.engine.core import Engine
from decoding.model.loading import load_model
from decoding.params import GenerationParams
from decoding.strategies.speculative import DraftLength
from tests.engine_harness import EngineHarness, as_served, tiny_llama
from tests.test_engine_speculative import byte_level_tokenizer

EARLY, LATE = (100, 150), (2000, 2050)


def step_times(harness: EngineHarness) -> dict[int, float]:
    """Generated length -> seconds of the step that produced it: the prompt fits one step and the
    tokens are forced, so step k produces token k (beams included, whose rows fill only at the end)."""
    times: dict[int, float] = {}
    engine = harness.engine
    with torch.inference_mode():
        while engine.has_work():
            started = time.perf_counter()
            engine.step()
            times[len(times) + 1] = time.perf_counter() - started
    return times


def window(times: dict[int, float], span: tuple[int, int]) -> float:
    values = [t for n, t in times.items() if span[0] <= n < span[1]]
    return statistics.median(values) if values else float("nan")


def run_case(tokenizer, params: GenerationParams, tokens: int) -> tuple[float, float]:  # noqa: ANN001
    harness = EngineHarness(tiny_llama(len(tokenizer), seed=1), tokenizer, [0], max_model_len=tokens + 64)
    harness.add("r", tokenizer.encode("The quick brown fox"), params)
    times = step_times(harness)
    return window(times, EARLY), window(times, LATE)


def run_universal(tokenizer, tokens: int) -> tuple[float, float]:  # noqa: ANN001
    other = byte_level_tokenizer()
    target = tiny_llama(len(tokenizer), seed=1)
    assistant = as_served(tiny_llama(len(other), seed=2))
    # the tiny assistant's tokenizer spends about a token per byte of text: give its slots room
    harness = EngineHarness(target, tokenizer, [0], max_num_seqs=2, max_model_len=4 * tokens)
    harness.engine = Engine(
        harness.engine.runner.model, tokenizer, [0], harness.engine.limits, harness._collect, torch.device("cpu"),
        assistants={"other": (assistant, other, {other.eos_token_id})},
    )  # fmt: skip
    params = GenerationParams(max_new_tokens=tokens, min_new_tokens=tokens, ignore_eos=True, assistant_model="other")
    harness.add("r", tokenizer.encode("The quick brown fox"), params)
    spec = harness.engine.requests["r"].strategy.specs[0]
    spec.length = DraftLength(3, "constant", max_pause=0, patience=10**9)  # draft every step, whatever it costs
    drafting: dict[int, float] = {}
    with torch.inference_mode():
        while harness.engine.has_work():
            harness.engine.step()
            request = harness.engine.requests.get("r")
            if request is not None and spec.draft_seconds:
                drafting[len(request.rows[0].output_ids)] = spec.draft_seconds
    return window(drafting, EARLY), window(drafting, LATE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2100)
    parser.add_argument("--case", default=None, help="run only the cases whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the tiny forwards gain nothing from threads; one thread times steadier
    tokenizer = load_model("smollm2-135m-instruct").tokenizer
    forced = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "ignore_eos": True}
    stop = ["never in this text: qqqqqqqq"]
    cases = {
        "greedy (reference)": GenerationParams(**forced),
        "greedy + stop strings": GenerationParams(**forced, stop=stop),
        "sampling + no_repeat_ngram 3": GenerationParams(**forced, do_sample=True, seed=0, no_repeat_ngram_size=3),
        "beam 4 + stop strings": GenerationParams(**forced, num_beams=4, stop=stop),
        "group beam 4/2": GenerationParams(**forced, num_beams=4, num_beam_groups=2, diversity_penalty=0.5),
    }
    print(f"| case | step at ~{EARLY[0]} tokens (ms) | at ~{LATE[0]} (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for name, params in cases.items():
        if args.case and args.case not in name:
            continue
        early, late = run_case(tokenizer, params, args.tokens)
        print(f"| {name} | {early * 1e3:.2f} | {late * 1e3:.2f} | {late / early:.2f} |", flush=True)
    if args.case and args.case not in "universal":
        return
    early, late = run_universal(tokenizer, args.tokens)
    print(f"| universal assisted (drafting stage) | {early * 1e3:.2f} | {late * 1e3:.2f} | {late / early:.2f} |")


if __name__ == "__main__":
    main()
