"""The tiny vision-language fixtures (tests/vlm_families.py) load as a user's folder and see their images.

The equivalence tests of issue 54 take ``hf_generate`` on these folders as the truth; these tests make sure that
truth means something: the folder loads through the Auto classes alone, the prompt holds the family's image
placeholders, and two images give two different greedy answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from decoding.custom.hf_bridge import sdpa
from decoding.model.attention import register_attention
from decoding.model.git_forward import routed
from decoding.model.loading import load_model
from tests.vlm_families import VLM_FAMILIES, VlmFamily, hf_generate, hf_inputs, load, make_image

ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
ASSISTANT = {"llava": "ASSISTANT:", "qwen2_vl": "<|im_start|>assistant\n", "qwen2_5_vl": "<|im_start|>assistant\n",
             "gemma3": "<start_of_turn>model\n", "idefics3": "Assistant:", "smolvlm": "Assistant:"}  # fmt: skip
FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "processor_config.json", "chat_template.jinja"}  # fmt: skip


@pytest.fixture(scope="module", params=VLM_FAMILIES, ids=lambda family: family.name)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[VlmFamily, Path]:
    """Each family's folder, written once for the module."""
    family: VlmFamily = request.param
    return family, family.save(tmp_path_factory.mktemp(family.name))


def test_folder_loads_with_the_auto_classes(built: tuple[VlmFamily, Path]) -> None:
    family, folder = built
    assert FILES <= {path.name for path in folder.iterdir()}
    processor, model = load(str(folder))
    assert model.config.model_type == family.model_type
    assert isinstance(processor, transformers.ProcessorMixin)
    assert model.generation_config.eos_token_id == processor.tokenizer.eos_token_id
    vocab = model.get_output_embeddings().weight.shape[0]
    assert vocab == len(processor.tokenizer) < 400


def test_git_also_loads_as_a_causal_lm(tmp_path: Path) -> None:
    folder = next(family for family in VLM_FAMILIES if family.name == "git").save(tmp_path)
    assert type(transformers.AutoModelForCausalLM.from_pretrained(folder)).__name__ == "GitForCausalLM"


def test_git_loads_as_the_server_loads_it(tmp_path: Path) -> None:
    """GIT is served (it was refused at load): its eager-only text attention is routed to Decoda's paged attention,
    and the load check's probe through the paged cache gives transformers' own logits."""
    folder = next(family for family in VLM_FAMILIES if family.name == "git").save(tmp_path / "git")
    loaded = load_model(str(folder), attn_implementation=register_attention(), cache_dir=str(tmp_path / "cache"))
    assert loaded.architecture == "GitForCausalLM" and routed(loaded.model)
    assert loaded.model.config._attn_implementation == "eager"  # GIT's only one; its vision tower runs it too


def test_prompt_holds_the_image_placeholders(built: tuple[VlmFamily, Path]) -> None:
    family, folder = built
    processor, _ = load(str(folder))
    inputs = hf_inputs(folder, ASK, [make_image(1)])
    extras = set(inputs) - {"input_ids", "attention_mask", "pixel_values"}
    assert extras == family.extras
    ids = inputs["input_ids"][0].tolist()
    if family.image_token is None:  # GIT: the features are prepended inside the model, no placeholders
        assert processor.tokenizer.decode(ids) == "[CLS]What is this?"
    else:
        image_id = processor.tokenizer.convert_tokens_to_ids(family.image_token)
        assert ids.count(image_id) == family.image_tokens
        # the marker the template writes once per image part (Gemma 3's is <start_of_image>, expanded around it)
        prompt = processor.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
        assert prompt.count(processor.image_token) == 1 and prompt.endswith(ASSISTANT[family.name])
    assert inputs["pixel_values"].dtype == torch.float32


def test_two_images_give_two_answers(built: tuple[VlmFamily, Path]) -> None:
    _, folder = built
    first = hf_generate(folder, ASK, [make_image(1)], max_new_tokens=8, do_sample=False)
    again = hf_generate(folder, ASK, [make_image(1)], max_new_tokens=8, do_sample=False)
    other = hf_generate(folder, ASK, [make_image(2)], max_new_tokens=8, do_sample=False)
    assert len(first) == 8 and first == again
    assert other != first


def test_string_content_renders_without_images(built: tuple[VlmFamily, Path]) -> None:
    _, folder = built
    tokens = hf_generate(folder, [{"role": "user", "content": "Hi"}], [], max_new_tokens=4, do_sample=False)
    assert len(tokens) == 4


def test_a_custom_generate_method_runs_git_with_its_own_attention(tmp_path: Path) -> None:
    """A custom ``generate()`` runs the model with transformers' own attention: GIT's is eager (it has no SDPA),
    which its served layers run whenever no step layout is given."""
    folder = next(family for family in VLM_FAMILIES if family.name == "git").save(tmp_path / "git")
    loaded = load_model(str(folder), attn_implementation=register_attention(), cache_dir=str(tmp_path / "cache"))
    ids = torch.tensor([[1, 40, 41, 42]])
    _, reference = load(str(folder))
    with sdpa(loaded.model):
        ours = loaded.model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert ours.tolist() == reference.generate(input_ids=ids, max_new_tokens=4, do_sample=False).tolist()
