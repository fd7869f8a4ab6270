"""The fair share's weights: ``--caller-weights`` (callers named as the access log names them, never by
their key) and ``weight=`` beside a key in ``--api-keys-file``, into the engine's config; a malformed
entry fails at start naming where it is, and never shows a key. ``--scheduling-policy`` takes vLLM's two
names. On the previous main none of these settings existed."""

from __future__ import annotations

import hashlib

import pytest

from decoding import GenerationParams, ParameterError
from decoding.params import validate
from server.config.settings import Settings


def name_of(key: str) -> str:
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def test_weights_from_the_keys_file_and_the_flag_reach_the_engine(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nsk-team-a weight=4\nsk-team-b\n\nsk-team-c  weight=0.5\n")
    settings = Settings(api_keys_file=str(keys), caller_weights=f"{name_of('sk-team-c')}=2,user:alice=3")
    settings.check()
    assert settings.api_keys() == ["sk-team-a", "sk-team-b", "sk-team-c"]
    assert settings.engine_config().caller_weights == {
        name_of("sk-team-a"): 4.0, name_of("sk-team-c"): 2.0, "user:alice": 3.0}  # fmt: skip


@pytest.mark.parametrize("spec", ["sk-raw-key=4", "key:xyz=2", "user:=1", "user:bob", "user:bob=0", "user:bob=-1",
                                  "user:bob=nan", "user:bob=much"])  # fmt: skip
def test_a_malformed_caller_weight_fails_at_start_naming_the_flag(spec):
    with pytest.raises(ValueError, match="caller-weights"):
        Settings(caller_weights=spec).check()


def test_a_malformed_weight_in_the_keys_file_fails_naming_the_file_not_the_key(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-secret-one weight=heavy\n")
    with pytest.raises(ValueError, match="API keys file") as failed:
        Settings(api_keys_file=str(keys)).check()
    assert "sk-secret-one" not in str(failed.value)
    keys.write_text("sk-secret-one priority=1\n")
    with pytest.raises(ValueError, match="weight=N") as failed:
        Settings(api_keys_file=str(keys)).check()
    assert "sk-secret-one" not in str(failed.value)


def test_the_scheduling_policy_is_fcfs_or_priority():
    assert Settings().scheduling_policy == "fcfs"
    Settings(scheduling_policy="priority").check()
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority"):
        Settings(scheduling_policy="fair").check()


def test_a_custom_generate_method_takes_no_priority():
    validate(GenerationParams(custom_generate="mine"))
    with pytest.raises(ParameterError) as refused:
        validate(GenerationParams(custom_generate="mine", priority=1))
    assert refused.value.param == "priority"
