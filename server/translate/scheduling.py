"""A request's place in the engine's line: its ``priority`` under the server's policy, and its caller.

``--scheduling-policy fcfs`` (the default, as vLLM's) serves no priorities: a body whose ``priority`` is
not 0 is a 400 naming ``priority``, as vLLM refuses it. Under ``priority`` a lower number runs first and
running requests of a higher number give way to it (``decoding/engine/policy.py``).

The caller is whose fair share the request counts in. With API keys it is the key that was checked
(``key:`` and the start of its digest, the name the access log shows): no body field can claim another
caller's share, nor split one key into many lines. Without keys it is the end user the body names
(``safety_identifier``, else ``user``; the Messages API's ``metadata.user_id``) as ``user:<id>``; a request
naming nobody is in the one anonymous line (""). Without keys those names are the client's word, as
everything is on such a server; ``--max-concurrency-per-key`` still caps by client address.
"""

from __future__ import annotations

from decoding import GenerationParams, ParameterError
from server.config.caller_weights import key_caller
from server.translate.fields import GenerationFields

POLICY_FLAG = "--scheduling-policy priority"


def caller_name(identity: str, body: GenerationFields) -> str:
    """The scheduler's name for who sent ``body``: the checked key's ``identity`` (hex digest; "" without
    keys), else the end user the body names, else ""."""
    if identity:
        return key_caller(identity)
    user = body.end_user()
    return f"user:{user}" if user else ""


def scheduled(params: GenerationParams, body: GenerationFields, policy: str, identity: str) -> GenerationParams:
    """``params`` with the request's caller; a priority the policy does not serve is a ``ParameterError``."""
    if policy != "priority" and params.priority != 0:
        raise ParameterError(f"priority is served with {POLICY_FLAG}; this server schedules first come first served "
                             f"(--scheduling-policy {policy}), so priority must be 0, got {params.priority}",
                             param="priority", code="priority_not_enabled")  # fmt: skip
    return params.replace(caller=caller_name(identity, body))
