"""compare.py names no developer-machine path: llama.cpp's interpreter is a flag or a variable, or
that server is skipped with a reason."""

from __future__ import annotations

from pathlib import Path

from loadtests import compare


def commands(monkeypatch, *flags: str) -> dict:
    monkeypatch.setattr(compare, "converted_folder", lambda model=None: None)  # no transformers serve view
    args = compare.build_parser().parse_args(list(flags))
    args.concurrency_list = [1]
    return compare.server_commands(args, 8123)


def test_llama_cpp_is_skipped_with_a_reason_when_no_interpreter_is_given(monkeypatch):
    monkeypatch.delenv(compare.LLAMACPP_ENV, raising=False)
    reason = commands(monkeypatch)[compare.LLAMACPP]
    assert isinstance(reason, str) and reason.startswith("skipped")
    assert "--llama-cpp-python" in reason and compare.LLAMACPP_ENV in reason
    assert "/work/" not in Path(compare.__file__).read_text()


def test_llama_cpp_interpreter_from_the_flag_or_the_environment(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setattr(compare, "smollm2_gguf", lambda: tmp_path / "model.gguf")
    monkeypatch.setenv(compare.LLAMACPP_ENV, str(python))
    command, _ = commands(monkeypatch)[compare.LLAMACPP]
    assert command[0] == str(python)
    monkeypatch.delenv(compare.LLAMACPP_ENV)
    command, _ = commands(monkeypatch, "--llama-cpp-python", str(python))[compare.LLAMACPP]
    assert command[0] == str(python)
    missing = commands(monkeypatch, "--llama-cpp-python", str(tmp_path / "nope"))[compare.LLAMACPP]
    assert missing.startswith("skipped") and "does not exist" in missing


def test_each_decoda_mode_is_its_own_server_with_its_flags(monkeypatch):
    servers = commands(monkeypatch, "--decoda-modes", "float32,gguf+compile")
    plain, _ = servers[compare.DECODA]
    compiled, model = servers[compare.decoda_name("gguf+compile")]
    assert "--quantization" not in plain
    assert compiled[compiled.index("--quantization") + 1] == "gguf" and "--compile" in compiled
    assert model == "smollm2-135m-instruct"


def test_a_baseline_ref_runs_from_its_own_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(compare, "baseline_checkout", lambda ref: tmp_path / ref)
    command, model = commands(monkeypatch, "--baseline", "v1")[compare.baseline_name("v1")]
    assert command[:3] == ["env", "--chdir", str(tmp_path / "v1")]
    assert command[3:6] == [compare.sys.executable, "-m", "server.cli"] and "--quantization" not in command
    assert model == "smollm2-135m-instruct"


def test_the_second_packaged_model_is_served_by_every_server(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setattr(compare, "packaged_gguf", lambda model: tmp_path / f"{model}.gguf")
    servers = commands(monkeypatch, "--model", "gemma3-270m", "--llama-cpp-python", str(python))
    decoda, model = servers[compare.DECODA]
    assert decoda[decoda.index("--model") + 1] == "gemma3-270m" and model == "gemma3-270m"
    llama, _ = servers[compare.LLAMACPP]
    assert llama[llama.index("--model") + 1] == str(tmp_path / "gemma3-270m.gguf")


def test_qwen_is_served_by_decoda_and_llama_cpp(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setattr(compare, "packaged_gguf", lambda model: tmp_path / f"{model}.gguf")
    prompt = "loadtests/prompts/tool_prompt.txt"
    flags = ["--model", "qwen2.5-coder-1.5b", "--decoda-modes", "gguf", "--llama-cpp-python", str(python)]
    servers = commands(monkeypatch, *flags, "--ttft-prompt", prompt)
    decoda, model = servers[compare.decoda_name("gguf")]
    assert decoda[decoda.index("--model") + 1] == "qwen2.5-coder-1.5b" and model == "qwen2.5-coder-1.5b"
    llama, _ = servers[compare.LLAMACPP]
    assert llama[llama.index("--model") + 1] == str(tmp_path / "qwen2.5-coder-1.5b.gguf")
    assert compare.BANNED["qwen2.5-coder-1.5b"] == "151643,151645"  # <|endoftext|>, <|im_end|>
