"""OpenAI's Responses API (``/v1/responses``): stateful conversations over the shared generation path."""
