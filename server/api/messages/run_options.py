"""The Messages API's top-level fields about how Anthropic runs a request rather than what the model reads.

The ``anthropic`` SDK's ``MessageCreateParams`` and ``MessageCountTokensParams`` define each; a body
built from them may carry any, null or set, so each is accepted as the hint it is or refused with a
400 naming it when its value asks for what this server does not run (``server.translate.unserved``'s
rule; null, and a value that asks for nothing, are always accepted):

- ``speed`` ("standard" or "fast"), ``inference_geo`` (the region inference runs in),
  ``user_profile_id`` (the party a request is made for) and ``workspace_id`` (the workspace a
  credential acts in; the SDK sends these two as the ``anthropic-user-profile-id`` and
  ``anthropic-workspace-id`` headers, which are not read either): hints with nothing to choose here,
  as the server runs one model at one speed where it is deployed, and the API key is the caller;
- ``container`` (a code-execution container and the skills loaded in it): refused unless null, as
  this server runs no code execution;
- ``diagnostics``: ``{}`` or ``{"previous_message_id": null}`` (opting in on a first turn, with nothing
  to compare) is accepted and the reply has no ``diagnostics``, as Anthropic's then; a
  ``previous_message_id`` asks why the prompt cache missed against that message, which needs the
  earlier message's prompt: this server keeps none, so it is refused (``usage.cache_read_input_tokens``
  says how much of a prompt the prefix cache supplied).
"""

from __future__ import annotations

from typing import Any, Literal

from server.translate.strict import Strict
from server.translate.unserved import refused_unless_null

NoContainer = refused_unless_null("container (a code-execution container)", "this server runs no code execution or "
                                  "skills; leave container out", kind=str | dict[str, Any])  # fmt: skip
NoEarlierMessage = refused_unless_null("diagnostics.previous_message_id (why the prompt cache missed against an "
                                       "earlier message)", "this server keeps no messages to compare a prompt "
                                       "with; usage.cache_read_input_tokens says how much of it the prefix cache "
                                       "supplied")  # fmt: skip


class Diagnostics(Strict):
    previous_message_id: NoEarlierMessage = None


class RequestHints(Strict):
    """What a message and a token count both take: hints (see the module's docstring)."""

    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class RunOptions(RequestHints):
    """What a message takes beyond a count's hints (see the module's docstring)."""

    inference_geo: str | None = None
    container: NoContainer = None
    diagnostics: Diagnostics | None = None
