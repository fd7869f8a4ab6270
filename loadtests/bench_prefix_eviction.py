"""What a full prefix cache keeps: two conversations taking turns on one replica whose KV cache holds about
one and a half of them.

Each turn of one conversation needs blocks the other's cached turn holds, so the cache must give up part
of a conversation. Which part decides what the next turn finds: the prefix is matched from its first
block on, so losing the first blocks loses it all, and losing the last ones keeps the rest. Prints each
turn's prompt and cached tokens (``usage.prompt_tokens_details.cached_tokens``) and the share of turns
2-4's prompt tokens the cache supplied.

    .venv/bin/python -m loadtests.bench_prefix_eviction --kv-cache-memory 110MB
"""

from __future__ import annotations

import argparse
import uuid

from openai import OpenAI

from loadtests.bench_sticky import QUESTIONS, SYSTEM, repair_log
from tests.test_e2e_openai import MODEL, start_server, stop_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-cache-memory", default="110MB",
                        help="the replica's KV cache; 110MB holds about 1.5 of these conversations (SmolLM2)")
    parser.add_argument("--document-words", type=int, default=600)
    args = parser.parse_args()
    flags = ("--max-model-len", "1664", "--max-num-seqs", "4", "--num-threads", "2")
    base, proc = start_server(*flags, "--kv-cache-memory", args.kv_cache_memory)
    client = OpenAI(base_url=f"{base}/v1", api_key="unused")
    conversations = []
    for _ in range(2):
        key = uuid.uuid4().hex
        system = f"Conversation {key}. {SYSTEM} The shop's repair log: {repair_log(key, args.document_words)}"
        conversations.append([{"role": "system", "content": system}])
    turns = []
    try:
        for number, question in enumerate(QUESTIONS, start=1):
            for which, messages in enumerate(conversations):
                messages.append({"role": "user", "content": question})
                answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0,
                                                        extra_body={"ignore_eos": True})  # fmt: skip
                messages.append({"role": "assistant", "content": answer.choices[0].message.content})
                prompt, details = answer.usage.prompt_tokens, answer.usage.prompt_tokens_details
                cached = details.cached_tokens if details and details.cached_tokens else 0
                turns.append((number, which, prompt, cached))
                print(f"turn {number}, conversation {which}: {prompt} prompt tokens, {cached} cached")
    finally:
        stop_server(proc)
    later = [(prompt, cached) for number, _, prompt, cached in turns if number >= 2]
    share = sum(cached for _, cached in later) / sum(prompt for prompt, _ in later)
    print(f"turns 2-4: {share:.1%} of prompt tokens from the cache (--kv-cache-memory {args.kv_cache_memory})")


if __name__ == "__main__":
    main()
