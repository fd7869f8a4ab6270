"""loadtests.agent_reference picks, from agent_tasks' --failures-json, each failed Chat Completions
run's last request and how many tokens Decoda answered it with (the replay itself needs the 1.5B model)."""

from __future__ import annotations

from loadtests.agent_reference import last_chat_turns


def test_the_last_chat_request_of_each_failed_run_is_replayed_for_as_many_tokens():
    first = {"messages": [{"role": "user", "content": "weather?"}], "tools": []}
    second = {"messages": [{"role": "user", "content": "weather?"}, {"role": "tool", "content": "{}"}], "tools": []}
    failures = [
        {"sdk": "agents-chat", "task": "weather", "exchanges": [
            [first, {"usage": {"completion_tokens": 21}}], [second, {"usage": {"completion_tokens": 19}}]]},
        {"sdk": "agents-responses", "task": "weather", "exchanges": [[{"input": "weather?"}, {"usage": {}}]]},
        {"sdk": "langchain-chat", "task": "currency", "exchanges": [[first, {"error": "cut"}]]},
    ]  # fmt: skip
    turns = last_chat_turns(failures)
    assert turns == [("agents-chat / weather", second, 19), ("langchain-chat / currency", first, 64)]
