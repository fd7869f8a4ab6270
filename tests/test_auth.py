"""API keys: several sources (flags, env comma list, keys file), the 401 shape, and which routes stay open."""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import pytest

from server.config.settings import Settings
from server.config.sources import add_arguments, load_settings
from server.http.auth import key_digests, token_matches
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, run

BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def settings_from(argv: list[str], environ: dict[str, str] | None = None, tmp_path: Path | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = []
    if tmp_path is not None:  # an empty config file: no checkout defaults leak in
        (tmp_path / "empty.yaml").write_text("{}\n")
        config = ["--config", str(tmp_path / "empty.yaml")]
    return load_settings(parser.parse_args(config + argv), environ or {})


async def statuses(settings: Settings, requests: list[tuple[str, str, str | None]]) -> list[httpx.Response]:
    """(method, path, key or None) each, against one app."""
    out = []
    async with client_for(FakeEngineClient(), **vars(settings)) as http:
        for method, path, key in requests:
            headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
            kwargs = {"json": BODY} if method == "POST" else {}
            out.append(await http.request(method, path, headers=headers, **kwargs))
    return out


def test_several_keys_from_repeated_flags_each_work(tmp_path: Path):
    settings = settings_from(["--api-key", "k1", "--api-key", "k2"], tmp_path=tmp_path)
    assert settings.api_keys() == ["k1", "k2"]
    responses = run(statuses(settings, [("POST", "/v1/completions", "k1"), ("POST", "/v1/completions", "k2"),
                                        ("POST", "/v1/completions", "k3")]))  # fmt: skip
    assert [r.status_code for r in responses] == [200, 200, 401]


def test_env_comma_list(tmp_path: Path):
    settings = settings_from([], {"DECODA_API_KEY": "alpha, beta,,"}, tmp_path=tmp_path)
    assert settings.api_keys() == ["alpha", "beta"]
    responses = run(statuses(settings, [("GET", "/v1/models", "beta"), ("GET", "/v1/models", "gamma")]))
    assert [r.status_code for r in responses] == [200, 401]
    # a flag wins over the variable
    assert settings_from(["--api-key", "flag"], {"DECODA_API_KEY": "env"}, tmp_path=tmp_path).api_keys() == ["flag"]


def test_keys_file_skips_comments_and_blank_lines(tmp_path: Path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# team A\nfile-key-1\n\n   \n  file-key-2  \n# revoked: old-key\n")
    settings = settings_from(["--api-keys-file", str(keys), "--api-key", "flag-key"], tmp_path=tmp_path)
    assert settings.api_keys() == ["flag-key", "file-key-1", "file-key-2"]
    from_env = settings_from([], {"DECODA_API_KEYS_FILE": str(keys)}, tmp_path=tmp_path)
    assert from_env.api_keys() == ["file-key-1", "file-key-2"]
    checks = [("POST", "/v1/completions", k) for k in ("file-key-1", "file-key-2", "flag-key", "# team A", "old-key")]
    assert [r.status_code for r in run(statuses(settings, checks))] == [200, 200, 200, 401, 401]


def test_missing_keys_file_is_a_startup_error(tmp_path: Path):
    with pytest.raises(ValueError, match="API keys file"):
        settings_from(["--api-keys-file", str(tmp_path / "nope.txt")], tmp_path=tmp_path)
    with pytest.raises(ValueError, match="API keys file"):
        settings_from([], {"DECODA_API_KEYS_FILE": str(tmp_path / "nope.txt")}, tmp_path=tmp_path)


def test_protect_metrics_without_any_key_is_a_startup_error(tmp_path: Path):
    with pytest.raises(ValueError, match="protect-metrics"):
        settings_from(["--protect-metrics"], tmp_path=tmp_path)


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic s3cret", "s3cret", "Bearer "])
def test_missing_or_wrong_key_is_401_in_openai_shape(header: str | None):
    async def go() -> httpx.Response:
        async with client_for(FakeEngineClient(), api_key="s3cret") as http:
            headers = {"Authorization": header} if header is not None else {}
            return await http.post("/v1/completions", json=BODY, headers=headers)

    r = run(go())
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    error = error_of(r)
    assert error["type"] in ("invalid_request_error", "authentication_error")
    assert error["code"] == "invalid_api_key" and error["param"] is None
    assert "s3cret" not in r.text


def test_health_ready_metrics_stay_open_with_keys():
    settings = Settings(api_key="s3cret")
    responses = run(statuses(settings, [("GET", "/health", None), ("GET", "/ready", None), ("GET", "/metrics", None),
                                        ("GET", "/v1/models", None)]))  # fmt: skip
    assert [r.status_code for r in responses] == [200, 200, 200, 401]


def test_protect_metrics_guards_metrics_only():
    settings = Settings(api_key="s3cret,other", protect_metrics=True)
    requests = [("GET", "/metrics", None), ("GET", "/metrics", "wrong"), ("GET", "/health", None),
                ("GET", "/ready", None), ("GET", "/metrics", "other")]  # fmt: skip
    responses = run(statuses(settings, requests))
    assert [r.status_code for r in responses] == [401, 401, 200, 200, 200]
    assert error_of(responses[0])["code"] == "invalid_api_key"
    assert responses[0].headers["www-authenticate"] == "Bearer"
    assert "decoda_http_requests_total" in responses[-1].text


def test_token_check_looks_at_every_key():
    digests = key_digests(["a", "b", "c"])
    assert token_matches("Bearer c", digests) and token_matches("bearer a", digests)
    assert not token_matches("Bearer d", digests) and not token_matches("Token a", digests)
    assert not token_matches("Bearer é", digests)  # non-ASCII never raises
    assert not token_matches("Bearer a", [])
