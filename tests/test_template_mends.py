"""Known mistakes in models' chat templates are mended before serving: Qwen2.5-Coder's tool-call example
shows doubled braces (a Jinja string literal prints ``{{`` as it is), and the model copied them into
its calls; a template without the mistake is served as the model's own."""

from __future__ import annotations

from transformers.utils.chat_template_utils import _compile_jinja_template

from decoding.engine.client import MODEL_TEMPLATE, ChatTemplates
from decoding.text.template_mends import mend_chat_template

# the tools part of Qwen2.5-Coder-1.5B-Instruct's own template (its GGUF's tokenizer.chat_template), verbatim
QWEN_CODER_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided '
    'with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}}\\n</tool_call><|im_end|>\\n" }}{%- endif %}'
)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def rendered(template: str) -> str:
    return _compile_jinja_template(template).render(tools=TOOLS, messages=[])


def test_the_doubled_braces_are_shown_to_the_model_unmended():
    assert '{{"name": <function-name>, "arguments": <args-json-object>}}' in rendered(QWEN_CODER_TOOLS)


def test_qwen_coder_template_is_served_with_its_example_mended():
    templates = ChatTemplates.for_model(QWEN_CODER_TOOLS, None, None)
    assert templates.default != MODEL_TEMPLATE
    shown = rendered(templates.choose(has_tools=True))
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in shown
    assert shown.replace("{", "").replace("}", "") == rendered(QWEN_CODER_TOOLS).replace("{", "").replace("}", "")


def test_a_template_without_the_mistake_is_the_models_own():
    sound = QWEN_CODER_TOOLS.replace('{{\\"name', '{\\"name').replace("object>}}", "object>}")
    assert mend_chat_template(sound) == (sound, [])
    assert ChatTemplates.for_model(sound, None, None).default == MODEL_TEMPLATE
    assert ChatTemplates.for_model(QWEN_CODER_TOOLS, "override", None).default == "override"  # --chat-template wins
