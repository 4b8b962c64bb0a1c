"""Configuration: flags, environment, precedence, and errors that name the key."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, HostPort, config_from_argv


def test_defaults():
    cfg = config_from_argv(["--upstream", "http://127.0.0.1:8000/"], env={})
    assert cfg.upstream == "http://127.0.0.1:8000"
    assert cfg.listen == HostPort("127.0.0.1", 8080)
    assert cfg.admin == HostPort("127.0.0.1", 9464)
    assert cfg.backend_label == "127.0.0.1:8000"
    assert cfg.inject_usage is True


def test_env_and_flag_precedence():
    env = {
        "TOKENSTAMP_UPSTREAM": "http://backend:9000",
        "TOKENSTAMP_LISTEN": "0.0.0.0:7000",
        "TOKENSTAMP_INJECT_USAGE": "false",
        "TOKENSTAMP_MODEL_ALLOWLIST": "a, b,,c",
        "TOKENSTAMP_PROVIDER": "sglang",
    }
    cfg = config_from_argv(["--provider", "vllm"], env=env)
    assert cfg.upstream == "http://backend:9000"
    assert cfg.listen == HostPort("0.0.0.0", 7000)
    assert cfg.inject_usage is False
    assert cfg.model_allowlist == ("a", "b", "c")
    assert cfg.provider == "vllm"  # the flag wins
    assert (
        config_from_argv(["--no-inject-usage", "--upstream", "http://x"], env={}).inject_usage
        is False
    )


@pytest.mark.parametrize(
    ("argv", "env", "key"),
    [
        ([], {}, "--upstream"),
        (["--upstream", "ftp://x"], {}, "--upstream"),
        (["--upstream", "http://x:99999"], {}, "--upstream"),
        ([], {"TOKENSTAMP_UPSTREAM": "nope"}, "TOKENSTAMP_UPSTREAM"),
        (["--upstream", "http://x", "--listen", "nohost"], {}, "--listen"),
        (["--upstream", "http://x", "--read-timeout", "-1"], {}, "--read-timeout"),
        (["--upstream", "http://x", "--max-body-bytes", "lots"], {}, "--max-body-bytes"),
        (
            ["--upstream", "http://x"],
            {"TOKENSTAMP_INJECT_USAGE": "maybe"},
            "TOKENSTAMP_INJECT_USAGE",
        ),
        (["--upstream", "http://x", "--log-level", "loud"], {}, "--log-level"),
        (["--upstream", "http://x", "--listen", ":9", "--admin", ":9"], {}, "--admin"),
    ],
)
def test_bad_values_name_the_key(argv, env, key):
    with pytest.raises(ConfigError, match="^" + key):
        config_from_argv(argv, env=env)


def test_loop_choice_is_validated_and_defaults_to_auto():
    assert config_from_argv(["--upstream", "http://u:1"], env={}).loop == "auto"
    assert (
        config_from_argv(["--upstream", "http://u:1", "--loop", "asyncio"], env={}).loop
        == "asyncio"
    )
    assert (
        config_from_argv(["--upstream", "http://u:1"], env={"TOKENSTAMP_LOOP": "UVLOOP"}).loop
        == "uvloop"
    )
    with pytest.raises(ConfigError, match=r"^--loop: expected auto, asyncio or uvloop"):
        config_from_argv(["--upstream", "http://u:1", "--loop", "trio"], env={})
