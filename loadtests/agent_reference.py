"""Whose failure is a failed agent run, the model's or the server's: replay its last Chat Completions turn
through transformers' own ``generate()``.

A run of ``loadtests.agent_tasks`` fails when the model answers in prose instead of calling a tool, calls
the wrong one, or repeats a call it already made. Such a reply is the server's fault only if the model,
given the same prompt, would have written something else. For each failed run of a Chat Completions SDK
(``--failures-json`` of agent_tasks), this takes the last request the SDK sent, renders it exactly as the
server does (``POST /tokenize`` with its messages and tools), and generates greedily twice from those
ids: Decoda (``/v1/completions``, the ids as the prompt, no grammar) and transformers' ``generate()`` on
the same GGUF dequantized to float32 (``from_pretrained(gguf_file=...)``). It prints both continuations,
special tokens included (but the end token), and whether they are the same text. Serve Decoda with
``--quantization none`` (the same dequantized float32 weights) for token equality; its default for this
model runs the GGUF's blocks natively with int8 activations, as llama.cpp does, and may part from
transformers' float32 after a few tokens.

    .venv/bin/python -m loadtests.agent_tasks --sdks agents-chat --failures-json /tmp/failed.json
    .venv/bin/python -m loadtests.agent_reference /tmp/failed.json --server-flags "--quantization none"
    .venv/bin/python -m loadtests.agent_reference /tmp/failed.json --base-url http://127.0.0.1:8000/v1

transformers loads the 1.1 GB GGUF into ~6 GB of float32 in about 80 s on 2 cores, and generates a few
tokens a second.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.agent_tasks import server
from loadtests.compare import cpu_summary


def last_chat_turns(failures: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], int]]:
    """(label, the last request body, the tokens Decoda answered it with) of each failed Chat Completions run."""
    turns = []
    for run in failures:
        chats = [(sent, answered) for sent, answered in run["exchanges"] if "messages" in sent]
        if not chats:
            continue
        sent, answered = chats[-1]
        usage = (answered.get("usage") or {}) if isinstance(answered, dict) else {}
        turns.append((f"{run['sdk']} / {run['task']}", sent, max(8, int(usage.get("completion_tokens") or 64))))
    return turns


def decoda_continuation(client: httpx.Client, base: str, model: str, ids: list[int], tokens: int) -> str:
    body = {"model": model, "prompt": ids, "max_tokens": tokens, "temperature": 0, "skip_special_tokens": False}
    return client.post(f"{base}/completions", json=body).raise_for_status().json()["choices"][0]["text"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("failures", type=Path, help="agent_tasks' --failures-json file")
    parser.add_argument("--base-url", help="a running server's OpenAI base URL (…/v1); else one is started")
    parser.add_argument("--served-model", help="the model name to send (default: the server's first)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="--model of the server started")
    parser.add_argument("--server-flags", default="", help="more flags for the server started")
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--gguf", type=Path, help="the GGUF transformers loads (default: the packaged model's)")
    args = parser.parse_args()
    turns = last_chat_turns(json.loads(args.failures.read_text()))
    if not turns:
        raise SystemExit(f"{args.failures}: no failed Chat Completions run to replay")
    print(cpu_summary(), flush=True)
    gguf = args.gguf or packaged_gguf(args.model)
    with server(args) as (base, model), httpx.Client(timeout=600) as client:
        prompts = []
        for label, sent, tokens in turns:
            render = {"model": model, "messages": sent["messages"], "tools": sent.get("tools")}
            ids = client.post(f"{base.removesuffix('/v1')}/tokenize", json=render).raise_for_status().json()["tokens"]
            prompts.append((label, ids, tokens, decoda_continuation(client, base, model, ids, tokens)))
        reference = load_reference(gguf)
        same = 0
        for label, ids, tokens, ours in prompts:
            theirs = reference(ids, tokens)
            same += ours == theirs
            print(f"\n## {label} ({len(ids)} prompt tokens, {tokens} generated): "
                  f"{'same text' if ours == theirs else 'DIFFERENT'}\nDecoda:       {ours!r}\ntransformers: {theirs!r}",
                  flush=True)  # fmt: skip
    print(f"\n{same}/{len(prompts)} continuations equal transformers' generate()")


def packaged_gguf(name: str) -> Path:
    from decoding.model.fetch import fetched_path
    from decoding.model.registry import PACKAGED_MODELS

    return fetched_path(PACKAGED_MODELS[name], Path.home() / ".cache" / "decoda")


def load_reference(gguf: Path):  # noqa: ANN201 (a closure over the loaded model)
    """``generate(ids, tokens) -> text``: transformers' greedy continuation on the GGUF dequantized to float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    print(f"transformers loaded {gguf.name} in {time.monotonic() - started:.0f} s", flush=True)

    ends = model.generation_config.eos_token_id
    ends = set(ends if isinstance(ends, list) else [ends])

    def generate(ids: list[int], tokens: int) -> str:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)
        new = out[0, len(ids) :].tolist()
        if new and new[-1] in ends:  # the end token a server stops at, which its text never holds
            new = new[:-1]
        return tokenizer.decode(new, skip_special_tokens=False)

    return generate


if __name__ == "__main__":
    main()
