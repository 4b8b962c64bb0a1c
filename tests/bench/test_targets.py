"""Target specs: builtins, --define, --targets."""

from __future__ import annotations

import pytest

from bench.targets import DEFAULT_TARGETS, TargetError, parse_define, select_targets


def test_default_targets_resolve_in_order():
    targets = select_targets(",".join(DEFAULT_TARGETS))
    assert [t.name for t in targets] == list(DEFAULT_TARGETS)
    assert targets[0].is_direct
    cmd = select_targets("tokenstamp")[0].command({"python": "py", "upstream": "http://u", "listen": "127.0.0.1:1",
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


def test_builtin_variants_are_entries_of_one_command():
    from bench.targets import BUILTIN_TARGETS

    known = {t.name: t for t in BUILTIN_TARGETS}
    assert DEFAULT_TARGETS == ("direct", "nginx", "passthrough", "passthrough-uvloop",
                               "tokenstamp-asyncio", "tokenstamp-uvloop", "tokenstamp-nostall")  # fmt: skip
    base = known["tokenstamp"].argv
    assert known["tokenstamp-asyncio"].argv == (*base, "--loop", "asyncio")
    assert known["tokenstamp-uvloop"].argv == (*base, "--loop", "uvloop")
    assert known["tokenstamp-nostall"].argv == (*base, "--stall-detection", "false")
    assert known["tokenstamp-edge"].argv == (*base, "--loop", "uvloop", "--observe", "false")
    assert known["passthrough-uvloop"].argv == (*known["passthrough"].argv, "--loop", "uvloop")
    assert known["nginx"].requires == "nginx"
    values = {"python": "py", "upstream": "http://u:1", "listen": "127.0.0.1:2", "workdir": "/w"}
    assert known["nginx"].command(values) == [
        "py", "-m", "bench.nginx", "--upstream", "http://u:1", "--listen", "127.0.0.1:2",
        "--dir", "/w",
    ]  # fmt: skip


def test_a_target_needing_a_missing_program_says_so():
    from bench.targets import TargetSpec

    assert TargetSpec("x", ("x",), requires="no-such-program-tokenstamp").missing() == (
        "no-such-program-tokenstamp not found on PATH or in /usr/sbin"
    )
    assert TargetSpec("y", ("sh",), requires="sh").missing() == ""
    assert TargetSpec("z", ("sh",)).missing() == ""
