"""The vision benchmark's pieces on a tiny LLaVA (``tests/vlm_families.py``): one round, two clients, one request
each, against a real ``decoda serve``. The report's structure and what the counters say, never a timing."""

from __future__ import annotations

import re

import pytest

from loadtests import bench_vision, vision_folder
from tests import vlm_families as vf

pytestmark = pytest.mark.e2e


def test_one_round_writes_both_figures_and_the_second_turn_runs_no_vision_tower(tmp_path):
    folder = vf.BY_NAME["llava"].save(tmp_path / "llava")
    out = tmp_path / "results" / "vision.md"
    argv = ["--model", str(folder), "--rounds", "1", "--clients", "2", "--requests-per-client", "1",
            "--max-tokens", "4", "--out", str(out), "--max-prefill-share", "0.5"]  # fmt: skip
    assert bench_vision.main(argv) == out
    text = out.read_text()
    assert "-m loadtests.bench_vision --model " in text and "--rounds 1 --clients 2 --requests-per-client 1" in text
    assert "flags: " in text and text.count("load average") >= 2  # uptime before and after
    assert "one `decoda serve` process with `--max-prefill-share 0.5`" in text  # the flag reached the server
    assert (tmp_path / "results" / "logs" / "vision-server.log").is_file()

    rows_a = re.findall(r"^\| 1 \| (\d) \| (\d+) \| [\d.]+ \| (\d+) \| (\d+) \| ([\d.]+) \|$", text, re.M)
    assert [r[:2] for r in rows_a] == [("1", "1"), ("2", "3")]  # turn 2 repeats the conversation, one more message
    (_, _, cached_1, images_1, _), (_, _, cached_2, images_2, seconds_2) = rows_a
    assert images_1 == "1" and int(cached_1) < 16  # the first turn encodes its image
    assert images_2 == "0" and float(seconds_2) == 0 and int(cached_2) >= 16  # the second reads it from the cache
    assert "the image is 16 tokens; goal: no vision time, the image cached: met" in text

    rows_b = re.findall(r"^\| 1 \| (text alone|text beside images) \| [\d.]+ \| [\d.-]+ \| [\d.]+ \| (\d+) \| (\d+) "
                        r"\| [\d.]+ \| [\d.-]+ \| (\d+) \|$", text, re.M)  # fmt: skip
    assert [r[0] for r in rows_b] == [bench_vision.ALONE, bench_vision.BESIDE]
    (_, alone_requests, alone_images, alone_errors), (_, requests, images, errors) = rows_b
    assert (alone_requests, alone_images) == ("0", "0")
    assert int(requests) >= 2 and int(images) == int(requests)  # each image client sent distinct images
    assert alone_errors == errors == "0"
    assert re.search(
        r"text clients beside image clients: \*\*[\d.]+x\*\* their tokens/s alone \([\d.]+x per round", text
    )


def test_the_bench_folder_has_the_shapes_the_goals_name():
    tokenizer = vision_folder.smollm2_tokenizer()
    config = vision_folder.llava_config(tokenizer)
    text, tower = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        576, 30, 9, 3)  # fmt: skip
    assert text.intermediate_size == 1536 and text.vocab_size == len(tokenizer) == 49153
    assert (tower.hidden_size, tower.num_hidden_layers, tower.num_attention_heads, tower.patch_size) == (
        768, 12, 12, 16)  # fmt: skip
    assert config.image_seq_length == vision_folder.IMAGE_TOKENS == 196
    processor = vision_folder.llava_processor(tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = processor(text=prompt, images=[vf.make_image(0, (224, 224))])["input_ids"][0]
    assert list(ids).count(config.image_token_index) == 196


def test_a_round_s_report_says_the_run_is_unfinished(tmp_path):
    args = bench_vision.build_parser().parse_args(["--rounds", "2", "--clients", "2"])
    args.image_tokens, args.model_title = 16, "tiny"
    turn = {"round": 1, "prompt_messages": 1, "ttft": 0.5, "cached_tokens": 0, "images": 1.0, "vision_s": 0.1,
            "error": None}  # fmt: skip
    phase = {"round": 1, "text_tok_s": 10.0, "text_ttft_p50": 0.1, "wall_s": 1.0, "image_requests": 0,
             "images": 0.0, "vision_s": 0.0, "image_ttft_p50": None, "text_errors": 0, "image_errors": 0,
             "first_error": None}  # fmt: skip
    phases = [{**phase, "phase": bench_vision.ALONE}, {**phase, "phase": bench_vision.BESIDE, "text_tok_s": 5.0}]
    report = {"model": "m", "second_turn": [{**turn, "turn": 1}, {**turn, "turn": 2, "cached_tokens": 32,
              "images": 0.0, "vision_s": 0.0, "prompt_messages": 3}], "phases": phases,
              "ratios": bench_vision.ratios(phases), "rounds_done": 1, "uptime_before": "a", "uptime_after": "b",
              "loads": [1.0]}  # fmt: skip
    text = bench_vision.write_markdown(report, args, "cmd", tmp_path / "v.md").read_text()
    assert "(so far: 1 of 2 rounds, the run goes on)" in text
    assert "**0.50x** their tokens/s alone (0.50x per round" in text and "goal >= 0.8x: not met" in text
