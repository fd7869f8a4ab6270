"""config/server.yaml is honoured wherever Decoda runs from: a checkout, the working directory, or a
``pip install .`` with no checkout around (the Docker image); ``--config`` / ``DECODA_CONFIG`` win."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from server.cli import build_parser
from server.config import sources as settings
from server.config.sources import load_settings

ROOT = Path(__file__).resolve().parent.parent


def yaml_file(path: Path, **values: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return path


@pytest.fixture
def no_checkout(monkeypatch, tmp_path):
    """As if installed: no sibling config/ beside the package, an empty working directory."""
    monkeypatch.setattr(settings, "SOURCE_CONFIG", tmp_path / "absent" / "server.yaml")
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    return workdir


def test_the_packaged_config_is_read_when_no_checkout_is_around(no_checkout, monkeypatch, tmp_path):
    packaged = yaml_file(tmp_path / "site-packages" / "server" / "defaults" / "server.yaml", max_queue=77, port=9001)
    monkeypatch.setattr(settings, "packaged_config", lambda: packaged)
    loaded = load_settings(environ={})
    assert (loaded.max_queue, loaded.port) == (77, 9001)


def test_the_working_directorys_config_comes_before_the_packaged_one(no_checkout, monkeypatch, tmp_path):
    packaged = yaml_file(tmp_path / "site-packages" / "server.yaml", max_queue=77)
    monkeypatch.setattr(settings, "packaged_config", lambda: packaged)
    yaml_file(no_checkout / "config" / "server.yaml", max_queue=55)
    assert load_settings(environ={}).max_queue == 55


def test_nothing_found_means_built_in_defaults(no_checkout, monkeypatch):
    monkeypatch.setattr(settings, "packaged_config", lambda: None)
    assert settings.config_path(environ={}) is None
    assert load_settings(environ={}).max_queue == settings.Settings().max_queue


def test_config_flag_and_environment_variable(no_checkout, tmp_path):
    flagged = yaml_file(tmp_path / "flag.yaml", max_queue=11, drain_timeout=3)
    from_env = yaml_file(tmp_path / "env.yaml", max_queue=22)
    args = build_parser().parse_args(["serve", "--config", str(flagged)])
    assert load_settings(args, environ={"DECODA_CONFIG": str(from_env)}).max_queue == 11  # the flag wins
    assert load_settings(environ={"DECODA_CONFIG": str(from_env)}).max_queue == 22
    assert load_settings(args, environ={"DECODA_MAX_QUEUE": "5"}).max_queue == 5  # env beats the file
    assert load_settings(build_parser().parse_args(["serve", "--config", str(flagged), "--max-queue", "9"]),
                         environ={}).max_queue == 9  # fmt: skip
    with pytest.raises(ValueError, match="config file not found"):
        load_settings(environ={"DECODA_CONFIG": str(tmp_path / "missing.yaml")})
    with pytest.raises(ValueError, match="unknown settings"):
        load_settings(environ={"DECODA_CONFIG": str(yaml_file(tmp_path / "bad.yaml", max_queues=1))})


def test_the_checkouts_config_is_the_one_the_repository_ships():
    assert settings.SOURCE_CONFIG == ROOT / "config" / "server.yaml" and settings.SOURCE_CONFIG.is_file()


@pytest.mark.slow
def test_pip_install_ships_config_server_yaml(tmp_path):
    """Build the wheel from a copy whose config/server.yaml says max_queue 77, install it with no
    checkout around, and read the settings from another directory."""
    source = tmp_path / "source"
    skip = shutil.ignore_patterns(".*", "build", "*.egg-info", "tests", "loadtests", "deploy", "__pycache__")
    shutil.copytree(ROOT, source, ignore=skip)
    yaml_file(source / "config" / "server.yaml", max_queue=77, port=9001)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(wheels)],
                   check=True, cwd=source)  # fmt: skip
    (wheel,) = wheels.glob("decoda-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = "import server.config.sources as s; x = s.load_settings(environ={}); print(s.__file__, x.max_queue, x.port)"
    code += "; import server.translate.presets as p; print(p.bundled_presets(), *p.load_presets(None).names())"
    # [presets]
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True)  # fmt: skip
    module_file, max_queue, port, presets_folder, *presets = out.stdout.split()
    assert Path(module_file).is_relative_to(target)  # the installed copy, not this checkout
    assert (max_queue, port) == ("77", "9001")
    assert Path(presets_folder).is_relative_to(target)  # config/presets/*.json ship inside the package
    assert presets == sorted(path.stem for path in (ROOT / "config" / "presets").glob("*.json"))
    # the native kernels' sources, which an installed server builds on first use
    for kernel in ("decoding/kv/paged_decode.cpp", "decoding/model/quantization/block_dot.cpp"):
        assert (target / kernel).is_file(), kernel


TRACKED_TEMPLATE = """{% for message in messages %}
{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}
{% else %}{{ message['content'] }}{% endif %}
{% endfor %}"""
FIRST_USER_TEMPLATE = """{% for message in messages %}
{% if message['role'] == 'user' %}{{ message['content'] }}{% break %}{% endif %}
{% if message['role'] == 'system' %}{% continue %}{% endif %}
{% endfor %}"""


@pytest.mark.parametrize("template", [TRACKED_TEMPLATE, FIRST_USER_TEMPLATE], ids=["generation", "loop_controls"])
def test_a_chat_template_using_transformers_extensions_passes_the_start_checks(tmp_path, template):
    from server.config.settings import Settings

    path = tmp_path / "hf.jinja"
    path.write_text(template)
    Settings(chat_template=str(path)).check()  # {% generation %} and {% break %} are transformers' Jinja


def test_a_broken_chat_template_fails_the_start_naming_the_flag_the_file_and_the_line(tmp_path):
    from server.config.settings import Settings

    path = tmp_path / "broken.jinja"
    path.write_text("{{ bos_token }}\n{% for message in messages %}{{ message['content'] }}\n{% endfor\n")
    with pytest.raises(ValueError, match=rf"--chat-template {path}: line 3: ") as error:
        Settings(chat_template=str(path)).check()
    assert "Traceback" not in str(error.value)
