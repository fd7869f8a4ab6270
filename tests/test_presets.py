"""Named generation presets: transformers' GenerationConfig files, loaded once, picked per request.

The bundled files are read by transformers' own ``GenerationConfig.from_pretrained`` and must
resolve to the same decoding mode there as here; requests get request > preset > model defaults;
a bad file stops the start naming the file and the field; an unknown name is a 400 listing the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from decoding.params import Strategy
from server.config.settings import Settings
from server.translate.presets import PresetError, Presets, bundled_presets, load_preset
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, post, run

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "config" / "presets"
REQUIRED = {"greedy", "creative", "precise", "beam4", "contrastive", "dola-high", "summarize"}
HF_MODE = {  # transformers' GenerationMode value -> our strategy
    "greedy_search": Strategy.GREEDY,
    "sample": Strategy.SAMPLE,
    "beam_search": Strategy.BEAM,
    "contrastive_search": Strategy.CONTRASTIVE,
    "dola_generation": Strategy.DOLA,
    "assisted_generation": Strategy.ASSISTED,
}


def submitted(body: dict, engine: FakeEngineClient | None = None, path: str = "/v1/completions", **settings):  # noqa: ANN201
    engine = engine or FakeEngineClient()
    base = {"prompt": "hello world"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = run(post(engine, path, {"model": MODEL, **base, **body}, **settings))
    assert r.status_code == 200, r.text
    return engine.submitted[0][2]


def write(folder: Path, name: str, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({**config, "transformers_version": "5.23.0"}))
    return path


# ---- the bundled files ------------------------------------------------------------------------------
def test_the_bundled_presets_are_shipped_and_found():
    assert bundled_presets() == SHIPPED
    assert REQUIRED <= {p.stem for p in SHIPPED.glob("*.json")}


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.json")), ids=lambda p: p.stem)
def test_transformers_reads_each_preset_and_resolves_the_same_mode(path):
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(path.parent, config_file_name=path.name)
    preset = load_preset(path)
    for key, value in preset.generation_config.items():
        hf_value = getattr(config, key)
        if hasattr(hf_value, "to_dict"):  # watermarking_config: HF's WatermarkingConfig object
            hf_value = {k: v for k, v in hf_value.to_dict().items() if k in value}
        assert hf_value == value, key
    params = Presets({preset.name: preset}).apply(_body(preset.name)).params({})
    assert HF_MODE[config.get_generation_mode().value] is params.strategy


def _body(name: str):  # noqa: ANN202
    from server.api.completions.protocol import CompletionRequest

    return CompletionRequest(prompt="hi", generation_preset=name)


# ---- GET /v1/presets ----------------------------------------------------------------------------------
def test_get_presets_lists_every_preset_with_its_config():
    async def get() -> httpx.Response:
        async with client_for(FakeEngineClient()) as http:
            return await http.get("/v1/presets")

    r = run(get())
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    listed = {item["id"]: item["generation_config"] for item in body["data"]}
    assert REQUIRED <= set(listed)
    assert listed["beam4"]["num_beams"] == 4 and "transformers_version" not in listed["beam4"]


def test_get_presets_needs_the_api_key():
    async def get(headers: dict) -> httpx.Response:
        async with client_for(FakeEngineClient(), api_key="s3cret") as http:
            return await http.get("/v1/presets", headers=headers)

    assert run(get({})).status_code == 401
    assert run(get({"Authorization": "Bearer s3cret"})).status_code == 200


def test_openapi_documents_the_presets_route():
    async def get() -> httpx.Response:
        async with client_for(FakeEngineClient()) as http:
            return await http.get("/openapi.json")

    operation = run(get()).json()["paths"]["/v1/presets"]["get"]
    assert {"200", "401"} <= set(operation["responses"])


# ---- requests -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_preset_sets_the_request_s_knobs(path):
    params = submitted({"generation_preset": "beam4", "max_tokens": 3}, path=path)
    assert params.num_beams == 4 and params.early_stopping is True and not params.do_sample
    assert params.strategy is Strategy.BEAM and params.generation_preset == "beam4"
    params = submitted({"generation_preset": "creative", "max_tokens": 3}, path=path)
    assert params.do_sample and params.temperature == 1.1 and params.top_p == 0.95 and params.top_k == 100
    params = submitted({"generation_preset": "contrastive", "max_tokens": 3}, path=path)
    assert params.strategy is Strategy.CONTRASTIVE and params.top_k == 4


def test_the_watermarked_preset_carries_its_watermarking_config():
    params = submitted({"generation_preset": "watermarked", "max_tokens": 2})
    config = params.watermarking_config
    assert params.do_sample and (config.greenlist_ratio, config.bias, config.seeding_scheme) == (0.25, 2.0, "lefthash")


def test_request_fields_win_over_the_preset():
    params = submitted({"generation_preset": "creative", "temperature": 0.5, "top_p": 0.7, "max_tokens": 3})
    assert params.temperature == 0.5 and params.top_p == 0.7 and params.top_k == 100  # top_k: the preset's
    # OpenAI's greedy switch drops the preset's sampling knobs instead of a "top_k only when sampling" 400
    params = submitted({"generation_preset": "creative", "temperature": 0, "max_tokens": 3})
    assert not params.do_sample and params.top_k is None and params.repetition_penalty == 1.05
    params = submitted({"generation_preset": "greedy", "temperature": 0.7, "max_tokens": 3})
    assert params.do_sample and params.temperature == 0.7  # the request's temperature turns sampling on


def test_request_aliases_win_over_the_preset_s_hf_names(tmp_path):
    write(tmp_path, "long", {"max_new_tokens": 40, "num_return_sequences": 2, "min_new_tokens": 1})
    params = submitted({"generation_preset": "long", "max_tokens": 5, "n": 1, "min_tokens": 0},
                       presets_dir=str(tmp_path))  # fmt: skip
    assert (params.max_new_tokens, params.n, params.min_new_tokens) == (5, 1, 0)
    params = submitted({"generation_preset": "long"}, presets_dir=str(tmp_path))
    assert (params.max_new_tokens, params.n, params.min_new_tokens) == (40, 2, 1)


def test_the_preset_wins_over_the_model_s_generation_config():
    engine = FakeEngineClient()
    engine.generation_defaults = {"do_sample": True, "temperature": 0.6, "top_p": 0.8}
    params = submitted({"generation_preset": "precise", "max_tokens": 2}, engine)
    assert params.temperature == 0.3 and params.top_p == 0.9
    engine = FakeEngineClient()
    engine.generation_defaults = {"do_sample": True, "temperature": 0.6, "top_p": 0.8}
    params = submitted({"generation_preset": "greedy", "max_tokens": 2}, engine)
    assert not params.do_sample
    engine = FakeEngineClient()
    engine.generation_defaults = {"do_sample": True, "temperature": 0.6, "top_p": 0.8}
    params = submitted({"max_tokens": 2}, engine)  # no preset: the model's defaults
    assert params.do_sample and params.temperature == 0.6


def test_an_unknown_preset_is_a_400_listing_the_available_ones():
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hi", "generation_preset": "nope"}))
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == "generation_preset" and "'nope'" in error["message"]
    assert all(name in error["message"] for name in REQUIRED)


def test_a_preset_knob_the_request_combines_badly_is_a_400_naming_it():
    body = {"model": MODEL, "prompt": "hi", "generation_preset": "beam4", "prompt_lookup_num_tokens": 3}
    r = run(post(FakeEngineClient(), "/v1/completions", body))
    assert r.status_code == 400 and error_of(r)["param"] == "num_beams"


# ---- --presets-dir and bad files ------------------------------------------------------------------------
def test_presets_dir_adds_and_replaces(tmp_path):
    write(tmp_path, "mine", {"do_sample": True, "temperature": 0.2})
    write(tmp_path, "greedy", {"do_sample": False, "repetition_penalty": 1.3})
    params = submitted({"generation_preset": "mine", "max_tokens": 2}, presets_dir=str(tmp_path))
    assert params.do_sample and params.temperature == 0.2
    params = submitted({"generation_preset": "greedy", "max_tokens": 2}, presets_dir=str(tmp_path))
    assert params.repetition_penalty == 1.3
    params = submitted({"generation_preset": "beam4", "max_tokens": 2}, presets_dir=str(tmp_path))
    assert params.num_beams == 4  # the bundled ones stay


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": "hot"}, "temperature"),
        ({"num_beams": 3, "num_beam_groups": 2}, "num_beam_groups"),
        ({"eos_token_id": 2}, "eos_token_id"),
        ({"max_tokens": 5}, "max_tokens"),  # OpenAI's name: a GenerationConfig file says max_new_tokens
        ({"guidance_scale": 0}, "guidance_scale"),
    ],
)
def test_a_bad_preset_fails_the_start_naming_file_and_field(tmp_path, content, field):
    path = write(tmp_path, "bad", content)
    with pytest.raises(PresetError) as caught:
        client_for(FakeEngineClient(), presets_dir=str(tmp_path))
    assert str(path) in str(caught.value) and f"'{field}'" in str(caught.value)


def test_unreadable_files_and_a_missing_folder_fail_the_start(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(PresetError, match="broken.json"):
        Presets.load([tmp_path])
    (tmp_path / "broken.json").write_text("[1, 2]")
    with pytest.raises(PresetError, match="JSON object"):
        Presets.load([tmp_path])
    with pytest.raises(PresetError, match="does not exist"):
        Presets.load([tmp_path / "missing"])


def test_the_cli_reports_a_bad_preset_and_exits_2(tmp_path, capsys):
    from server.cli import main

    write(tmp_path, "bad", {"top_k": -1})
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--presets-dir", str(tmp_path), "--port", "1"])
    assert exited.value.code == 2
    assert "bad.json" in capsys.readouterr().err


def test_presets_dir_is_a_setting_like_every_other():
    assert Settings(presets_dir="/x").presets_dir == "/x"
