"""A chat template is checked at start by the compiler that will render it: transformers' own.

transformers compiles a chat template in its sandboxed Jinja environment with extensions a plain
``jinja2.Environment`` lacks: ``{% generation %}...{% endgeneration %}`` (its assistant-token
tracker) and the loop controls ``{% break %}`` / ``{% continue %}``. Parsing with plain Jinja would
refuse valid Hugging Face templates; parsing with transformers' environment refuses exactly what
``apply_chat_template`` would. transformers is imported inside the function: the server's settings
call this, and importing them must not import torch (the chat-template module imports neither).
"""

from __future__ import annotations


def check_chat_template(source: str, name: str) -> None:
    """Raise ``ValueError("{name}: line N: why")`` when ``source`` does not compile as transformers
    compiles a chat template (``transformers.utils.chat_template_utils._compile_jinja_template``)."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"{name}: line {error.lineno}: {error.message}") from error
