"""The bench's first line: when, what and where it ran, read from the machine itself."""

from __future__ import annotations

import platform
import re
import subprocess
from datetime import UTC, datetime

import proxy
from bench.environment import cpu_model, git_commit, line, nginx_version
from bench.nginx import find_program

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC   7B13 64-Core Processor
flags\t\t: fpu vme

processor\t: 1
model name\t: AMD EPYC 7B13 64-Core Processor
"""


def test_the_line_names_the_run_the_checkout_the_libraries_and_the_host():
    text = line(datetime(2026, 12, 7, 5, 9, tzinfo=UTC))
    assert text.startswith(f"Run 2026-12-07 05:09 UTC: tokenstamp {proxy.__version__} (")
    assert f"({proxy.hot_path_build()} build" in text
    assert f"Python {platform.python_version()}, aiohttp " in text
    assert f"; {platform.system()} {platform.release()}, " in text
    assert text.endswith(".")
    if find_program("nginx") is not None:
        assert re.search(r", nginx \d+\.\d+\.\d+;", text)


def test_cpu_model_is_the_first_model_name_with_spaces_collapsed():
    assert cpu_model(CPUINFO) == "AMD EPYC 7B13 64-Core Processor"
    assert cpu_model("processor : 0\nCPU implementer : 0x41\n") is None


def _git(tree, *args):
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


def test_commit_is_short_sha_and_dirty_only_for_changed_tracked_files(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"],
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert git_commit(tmp_path) == sha
    (tmp_path / "untracked.txt").write_text("x\n")
    assert git_commit(tmp_path) == sha
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(tmp_path) == f"{sha}-dirty"


def test_no_commit_outside_the_top_of_a_work_tree(tmp_path):
    assert git_commit(tmp_path) is None  # not a repository (an installed wheel)
    _git(tmp_path, "init", "-q")
    (tmp_path / "site-packages").mkdir()
    assert git_commit(tmp_path / "site-packages") is None  # inside another repository


def test_nginx_version_is_what_nginx_prints():
    program = find_program("nginx")
    if program is None:
        assert nginx_version() is None
        return
    said = subprocess.run([program, "-v"], capture_output=True, text=True, check=False).stderr
    assert f"nginx/{nginx_version()}" in said
