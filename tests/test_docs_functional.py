"""README and docs/ stay true: generated tables current, no dead link, commands that run.

- The generated blocks of ``docs/`` (metrics, configuration) equal what
  ``scripts/gen_docs.py`` makes from the code now.
- Every relative link of README.md and docs/*.md reaches a file, and every
  ``#anchor`` a heading of its page (GitHub's slugs).
- ``tokenstamp --help`` and each subcommand's help name a docs page that exists.
- README stays short, its two commands are the Makefile's and CI's, and its quick
  start runs exactly as written against the simulator standing in for a server.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES]
BIN = Path(sys.executable).parent


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_current():
    gen = _gen_docs()
    pages = gen.pages()
    assert {p.name for p in pages} >= {"metrics.md", "configuration.md"}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert gen.render(text) == text, f"{page.name} is stale: run python scripts/gen_docs.py"


def test_every_instrument_and_flag_is_in_the_generated_pages():
    from exporters import names
    from proxy.config import SERVE_OPTIONS

    metrics = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    for inst in names.ALL:
        assert f"`{inst.name}`" in metrics, inst.name
    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for opt in SERVE_OPTIONS:
        assert f"`--{opt.flag}`" in configuration, opt.flag
    assert "`config.bodyBudget`" in configuration


# Links

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    """``text`` without fenced blocks and inline code (links there are examples)."""
    return _CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown page (repeats get -1, -2, as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return [m.group(1) for m in _LINK.finditer(_prose(path.read_text(encoding="utf-8")))]


def test_the_slug_rule_matches_githubs():
    assert slug("What the proxy changes, and what it never does") == (
        "what-the-proxy-changes-and-what-it-never-does"
    )
    assert slug("`tokenstamp serve`") == "tokenstamp-serve"
    assert slug("Quick start in front of your server (60 seconds)") == (
        "quick-start-in-front-of-your-server-60-seconds"
    )


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    dead = []
    for target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            dead.append(f"{target}: no such file")
            continue
        if anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            dead.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not dead, f"{path.name}: " + "; ".join(dead)


def test_every_docs_page_is_reachable_from_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _links(README)}
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert not missing, f"docs pages README does not link: {missing}"


# Help


def _helps() -> dict[str, str]:
    from proxy.cli import build_parser

    parser = build_parser()
    out = {"tokenstamp": parser.format_help()}
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            out.update({name: sub.format_help() for name, sub in choices.items()})
    return out


def test_every_help_points_to_a_docs_page_that_exists():
    helps = _helps()
    assert set(helps) >= {"tokenstamp", "serve", "simulate", "demo", "bench", "advise"}
    for name, text in helps.items():
        pages = re.findall(r"docs/[a-z-]+\.md", " ".join(text.split()))
        assert pages, f"{name} --help names no docs page"
        for page in pages:
            assert (ROOT / page).exists(), f"{name} --help names {page}, which does not exist"


# README


def _blocks(text: str) -> list[str]:
    return [m.group(0).split("\n", 1)[1].rsplit("\n", 1)[0] for m in _FENCE.finditer(text)]


def test_readme_is_short_and_its_two_commands_are_the_makefiles_and_cis():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in _blocks(section)[0].splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)


def _quick_start() -> list[str]:
    """The README's quick start, as the commands a user types (continuations joined)."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands, current = [], ""
    for line in _blocks(section)[0].splitlines():
        if not current and line.lstrip().startswith("#"):
            continue
        current += line.rstrip("\\") + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _wait(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.timeout(300)
def test_the_quick_start_runs_as_written_against_the_simulator():
    """Each command of the block, in a shell at the repository's root, in order; the one
    ending in ``&`` runs on in the background (as a user's terminal keeps it), and the
    next command waits until it answers. The simulator stands in for the model server."""
    ports = (8000, 8080, 9464)
    busy = [p for p in ports if not _free(p)]
    if busy:
        pytest.skip(f"the quick start's ports are in use here: {busy}")
    commands = _quick_start()
    assert commands[0].startswith("make install")
    assert any(c.endswith("&") and "tokenstamp serve" in c for c in commands)
    simulator = subprocess.Popen(
        [str(BIN / "tokenstamp"), "simulate", "--listen", "127.0.0.1:8000", "--profile", "fast"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    background: list[subprocess.Popen[bytes]] = []
    outputs = []
    try:
        _wait("http://127.0.0.1:8000/health")
        for command in commands:
            if command.endswith("&"):
                background.append(
                    subprocess.Popen(["bash", "-c", "exec " + command[:-1]], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )  # fmt: skip
                _wait("http://127.0.0.1:9464/readyz")
                continue
            done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True,
                                  text=True, timeout=240)  # fmt: skip
            assert done.returncode == 0, f"{shlex.quote(command)}: {done.stderr[-2000:]}"
            outputs.append(done.stdout)
    finally:
        for proc in (*background, simulator):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    stream, metrics = outputs[-2], outputs[-1]
    assert '"content"' in stream
    assert stream.rstrip().endswith("data: [DONE]")
    count = re.findall(r"^gen_ai_server_time_to_first_token_seconds_count\{.*\} (\S+)$",
                       metrics, re.MULTILINE)  # fmt: skip
    assert [float(c) for c in count] == [1.0]


@pytest.mark.timeout(300)
def test_make_demo_runs_as_written():
    """The first of README's two commands, as a newcomer types it (the second, ``make
    test``, is what CI runs: ``.ci/run``)."""
    done = subprocess.run(["make", "demo"], cwd=ROOT, capture_output=True, text=True,
                          timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "Forty streams decoding, one 4,000-token prompt arrives" in out
    assert "Detected by the proxy" in out
    assert "The advisor, fitted by the proxy" in out
