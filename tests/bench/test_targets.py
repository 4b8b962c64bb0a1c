"""Target specs: builtins, --define, --targets."""

from __future__ import annotations

import pytest

from bench.targets import DEFAULT_TARGETS, TargetError, parse_define, select_targets


def test_default_targets_resolve_in_order():
    targets = select_targets(",".join(DEFAULT_TARGETS))
    assert [t.name for t in targets] == ["direct", "passthrough", "tokenstamp"]
    assert targets[0].is_direct
    cmd = targets[2].command({"python": "py", "upstream": "http://u", "listen": "127.0.0.1:1",
                              "admin": "127.0.0.1:2", "port": "1", "admin_port": "2"})  # fmt: skip
    assert cmd[:4] == ["py", "-m", "proxy.cli", "serve"]
    assert "http://u" in cmd
    assert "127.0.0.1:2" in cmd


def test_define_takes_leading_env_and_shell_quoting():
    t = parse_define("ts-nostall=TOKENSTAMP_X=off A=1 {python} -m proxy.cli serve --upstream "
                     "{upstream} --listen '{listen}'")  # fmt: skip
    assert t.name == "ts-nostall"
    assert t.env == (("TOKENSTAMP_X", "off"), ("A", "1"))
    assert t.argv[0] == "{python}"
    assert t.argv[-1] == "{listen}"
    chosen = select_targets("direct,ts-nostall", [t])
    assert chosen[1] is t


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("noequals", "NAME=COMMAND"),
        ("x=A=1", "no command"),
        ("direct=python x", "reserved"),
        ("bad name=python", "NAME=COMMAND"),
        ("x=python 'unclosed", "quotation"),
    ],
)
def test_bad_defines_name_the_problem(text, match):
    with pytest.raises(TargetError, match=match):
        parse_define(text)


def test_unknown_duplicate_or_empty_targets_refused():
    with pytest.raises(TargetError, match="unknown target 'nope'"):
        select_targets("direct,nope")
    with pytest.raises(TargetError, match="twice"):
        select_targets("direct,direct")
    with pytest.raises(TargetError, match="at least one"):
        select_targets(" , ")


def test_bad_placeholder_is_reported():
    t = parse_define("x={python} {nope}")
    with pytest.raises(TargetError, match="placeholder"):
        t.command({"python": "py"})
