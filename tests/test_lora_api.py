"""LoRA adapters over HTTP (fake engine): ``model`` selects an adapter on every generation API, the listing,
vLLM's runtime load/unload routes (only with ``--enable-lora-loading``, only for admin keys, fenced to
``--lora-dir``), the flags, the gauge."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from decoding import LoraBusyError, LoraLimitError, ParameterError, ServedModel
from server.config.lora_modules import parse_lora_modules
from server.config.sources import add_arguments, load_settings
from server.http.metrics import Metrics
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, run


class LoraFakeEngine(FakeEngineClient):
    """The fake engine serving adapters: loads anything it is handed, refuses to unload a busy one."""

    def __init__(self, adapters: tuple[str, ...] = ("sql",), busy: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.adapters = {name: f"/loras/{name}" for name in adapters}
        self.busy = set(busy)

    def served_models(self) -> list[ServedModel]:
        loras = [ServedModel(n, "lora", self.max_model_len, parent=MODEL, root=p) for n, p in self.adapters.items()]
        return [*super().served_models(), *loras]

    def serves_loras(self) -> bool:
        return True

    def lora_names(self) -> list[str]:
        return list(self.adapters)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        if name in self.adapters:
            raise ParameterError(f"the name '{name}' is already served", param="lora_name")
        self.adapters[name] = path

    async def unload_lora_adapter(self, name: str) -> None:
        if name not in self.adapters:
            await super().unload_lora_adapter(name)
        if name in self.busy:
            raise LoraBusyError(f"the LoRA adapter '{name}' has 1 request(s) in flight")
        del self.adapters[name]


def _post(engine: FakeEngineClient, path: str, body: dict, headers: dict | None = None, **settings: object):  # noqa: ANN202
    async def go():  # noqa: ANN202
        async with client_for(engine, **settings) as http:
            return await http.post(path, json=body, headers=headers or {})

    return run(go())


GENERATION = [
    ("/v1/completions", {"prompt": "hello", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}),
    ("/v1/responses", {"input": "hello", "max_output_tokens": 2, "store": False}),
]


@pytest.mark.parametrize(("path", "body"), GENERATION, ids=["completions", "chat", "responses"])
def test_model_names_the_adapter_on_every_generation_api(path, body):
    engine = LoraFakeEngine()
    response = _post(engine, path, {**body, "model": "sql"})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "sql"
    assert engine.submitted[-1][2].lora_name == "sql"
    base = _post(engine, path, {**body, "model": MODEL})
    assert base.status_code == 200 and engine.submitted[-1][2].lora_name is None


@pytest.mark.parametrize(("path", "body"), GENERATION, ids=["completions", "chat", "responses"])
def test_an_unknown_adapter_is_a_404_as_for_models(path, body):
    response = _post(LoraFakeEngine(), path, {**body, "model": "nope"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["param"] == "model" and error["code"] == "model_not_found" and "sql" in error["message"]


MESSAGE = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


def test_messages_api_model_names_the_adapter():
    engine = LoraFakeEngine()
    response = _post(engine, "/v1/messages", {**MESSAGE, "model": "sql"})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "sql" and engine.submitted[-1][2].lora_name == "sql"
    base = _post(engine, "/v1/messages", {**MESSAGE, "model": MODEL})
    assert base.status_code == 200 and base.json()["model"] == MODEL and engine.submitted[-1][2].lora_name is None
    counted = _post(engine, "/v1/messages/count_tokens", {"messages": MESSAGE["messages"], "model": "sql"})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_messages_api_unknown_adapter_is_its_own_404(path):
    body = {"messages": MESSAGE["messages"], "model": "nope"}
    if path == "/v1/messages":
        body["max_tokens"] = 2
    response = _post(LoraFakeEngine(), path, body)
    assert response.status_code == 404
    answer = response.json()
    assert answer["type"] == "error" and answer["error"]["type"] == "not_found_error"
    assert "'nope'" in answer["error"]["message"] and "sql" in answer["error"]["message"]


def test_custom_generate_cannot_run_an_adapter():
    body = {"prompt": "hello", "max_tokens": 2, "model": "sql", "custom_generate": "x"}
    response = _post(LoraFakeEngine(), "/v1/completions", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"


def test_models_lists_adapters_with_their_parent():
    async def go():  # noqa: ANN202
        async with client_for(LoraFakeEngine()) as http:
            return (await http.get("/v1/models")).json()["data"]

    data = {entry["id"]: entry for entry in run(go())}
    assert data["sql"]["parent"] == MODEL and data["sql"]["role"] == "lora" and data["sql"]["root"] == "/loras/sql"
    assert data[MODEL]["parent"] is None


def test_load_reads_only_folders_under_lora_dir(tmp_path):
    fence = tmp_path / "loras"
    (fence / "math").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (fence / "escape").symlink_to(outside)
    (fence / "inner").mkdir()
    (fence / "inner" / "adapter_model.safetensors").symlink_to(outside / "weights")
    (outside / "weights").write_text("x")
    engine = LoraFakeEngine()
    settings = {"lora_dir": str(fence), "enable_lora_loading": True}
    ok = _post(engine, "/v1/load_lora_adapter", {"lora_name": "math", "lora_path": "math"}, **settings)
    assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'math' added successfully."
    assert engine.adapters["math"] == str((fence / "math").resolve())
    for path in (str(outside), "../elsewhere", "escape", "inner", str(fence)):
        refused = _post(engine, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path}, **settings)
        assert refused.status_code == 400, path
        assert refused.json()["error"]["param"] == "lora_path" and "x" not in engine.adapters
    missing = _post(engine, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "nothing"}, **settings)
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "lora_path_not_found"
    no_dir = _post(engine, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "math"}, enable_lora_loading=True)
    assert no_dir.status_code == 400 and no_dir.json()["error"]["code"] == "lora_loading_disabled"
    unknown_field = _post(engine, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "math", "f": 1}, **settings)
    assert unknown_field.status_code == 400


def test_unload_refuses_a_busy_adapter_and_an_unknown_one():
    engine = LoraFakeEngine(adapters=("sql", "math"), busy=("math",))
    busy = _post(engine, "/v1/unload_lora_adapter", {"lora_name": "math"}, enable_lora_loading=True)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "lora_in_use" and "math" in engine.adapters
    unknown = _post(engine, "/v1/unload_lora_adapter", {"lora_name": "nope"}, enable_lora_loading=True)
    assert unknown.status_code == 404
    done = _post(engine, "/v1/unload_lora_adapter", {"lora_name": "sql"}, enable_lora_loading=True)
    assert done.status_code == 200 and done.text == "Success: LoRA adapter 'sql' removed successfully."
    assert "sql" not in engine.adapters


def test_runtime_routes_exist_only_with_enable_lora_loading(tmp_path):
    """As vLLM registers them only with VLLM_ALLOW_RUNTIME_LORA_UPDATING: without the flag they are 404s
    (previous main: open to every caller, a 200)."""
    engine = LoraFakeEngine()
    (tmp_path / "a").mkdir()
    load = {"lora_name": "a", "lora_path": "a"}
    for path, body in (("/v1/load_lora_adapter", load), ("/v1/unload_lora_adapter", {"lora_name": "sql"})):
        assert _post(engine, path, body, lora_dir=str(tmp_path)).status_code == 404
    assert "a" not in engine.adapters and "sql" in engine.adapters

    async def paths(**settings: object) -> dict:
        async with client_for(engine, **settings) as http:
            return (await http.get("/openapi.json")).json()["paths"]

    assert "/v1/load_lora_adapter" not in run(paths())
    documented = run(paths(enable_lora_loading=True, lora_dir=str(tmp_path)))["/v1/load_lora_adapter"]["post"]
    assert {"403", "429"} <= set(documented["responses"])


def test_runtime_routes_need_an_admin_key(tmp_path):
    """A plain API key may call the model, not change its adapters: 403 naming the admin key (previous main:
    any valid key loaded adapters, a 200)."""
    engine = LoraFakeEngine()
    (tmp_path / "a").mkdir()
    keys = {"api_key": "k", "admin_api_key": "admin", "enable_lora_loading": True, "lora_dir": str(tmp_path)}
    load = {"lora_name": "a", "lora_path": "a"}
    assert _post(engine, "/v1/load_lora_adapter", load, **keys).status_code == 401
    plain = _post(engine, "/v1/load_lora_adapter", load, {"Authorization": "Bearer k"}, **keys)
    assert plain.status_code == 403 and "a" not in engine.adapters
    error = plain.json()["error"]
    assert error["type"] == "permission_error" and error["code"] == "admin_key_required"
    assert "--admin-api-key" in error["message"]
    unload = _post(engine, "/v1/unload_lora_adapter", {"lora_name": "sql"}, {"x-api-key": "k"}, **keys)
    assert unload.status_code == 403 and "sql" in engine.adapters
    ok = _post(engine, "/v1/load_lora_adapter", load, {"Authorization": "Bearer admin"}, **keys)
    assert ok.status_code == 200 and "a" in engine.adapters
    # an admin key is an API key too
    chat = _post(engine, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "model": "a"}, {"x-api-key": "admin"},
                 **keys)  # fmt: skip
    assert chat.status_code == 200


def test_a_full_set_of_busy_adapters_is_a_429_naming_the_cap(tmp_path):
    class Full(LoraFakeEngine):
        async def load_lora_adapter(self, name: str, path: str) -> None:
            raise LoraLimitError("8 LoRA adapters are loaded (--max-loaded-loras) and each has requests in flight")

    (tmp_path / "a").mkdir()
    full = _post(Full(), "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "a"}, enable_lora_loading=True,
                 lora_dir=str(tmp_path))  # fmt: skip
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    error = full.json()["error"]
    assert error["code"] == "lora_limit" and error["param"] == "lora_name" and "--max-loaded-loras" in error["message"]


def test_loading_flags_go_together(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def settings(*argv: str):  # noqa: ANN202
        return load_settings(parser.parse_args(list(argv)), environ={})

    folder = os.fspath(tmp_path)
    with pytest.raises(ValueError, match="--enable-lora-loading"):
        settings("--lora-dir", folder)
    with pytest.raises(ValueError, match="--lora-dir"):
        settings("--enable-lora-loading")
    with pytest.raises(ValueError, match="--admin-api-key"):
        settings("--enable-lora-loading", "--lora-dir", folder, "--api-key", "k")
    with pytest.raises(ValueError, match="max_loaded_loras"):
        settings("--max-loaded-loras", "0")
    both = settings("--enable-lora-loading", "--lora-dir", folder, "--api-key", "k", "--admin-api-key", "a1,a2",
                    "--admin-api-key", "a3", "--max-loaded-loras", "3")  # fmt: skip
    assert both.admin_api_keys() == ["a1", "a2", "a3"] and both.api_keys() == ["k", "a1", "a2", "a3"]
    assert both.engine_config().max_loaded_loras == 3
    assert settings().max_loaded_loras == 8
    assert load_settings(parser.parse_args([]), environ={"DECODA_ADMIN_API_KEY": "e1, e2"}).admin_api_keys() == [
        "e1", "e2"]  # fmt: skip


def test_lora_modules_flag_both_spellings_repeatable(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = json.dumps({"name": "b", "path": "/l/b", "base_model_name": "smollm2-135m-instruct"})
    args = parser.parse_args(["--lora-modules", "a=/l/a", "--lora-modules", spec, "--max-loras", "2"])
    config = load_settings(args, environ={}).engine_config()
    assert config.lora_modules == [("a", "/l/a", None), ("b", "/l/b", "smollm2-135m-instruct")]
    assert config.max_loras == 2 and config.max_lora_rank == 16 and config.serves_loras
    assert parse_lora_modules(f"x=/p,{spec}") == [("x", "/p", None), ("b", "/l/b", "smollm2-135m-instruct")]
    for bad in ("noequals", '{"name": "a"}', '{"name": "a", "path": "p", "rank": 2}', "a=/x,a=/y"):
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_lora_modules(bad)
    with pytest.raises(ValueError, match="max_loras"):
        load_settings(parser.parse_args(["--max-loras", "0"]), environ={})
    with pytest.raises(ValueError, match="--lora-dir"):
        load_settings(parser.parse_args(["--lora-dir", os.fspath(tmp_path / "absent")]), environ={})


def test_lora_requests_info_gauge_is_vllms():
    metrics = Metrics()
    metrics.on_lora_requests(["a", "b"], ["c"], 4)
    metrics.on_lora_requests(["a"], [], 4)
    text = metrics.render().decode()
    lines = [line for line in text.splitlines() if line.startswith("decoda_lora_requests_info{")]
    assert len(lines) == 1  # only the current adapters
    assert 'running_lora_adapters="a"' in lines[0] and 'waiting_lora_adapters=""' in lines[0]
    assert 'max_lora="4"' in lines[0]
