"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) over chat's path.

``blocks`` the conversation's content blocks and what of them reaches the chat template, ``protocol``
the bodies, ``format`` the reply's content blocks and message object, ``events`` its stream,
``errors`` Anthropic's error shape, ``route`` the handlers.
"""
