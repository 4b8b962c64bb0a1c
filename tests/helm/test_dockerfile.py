"""The Dockerfile: its shape, and its wheel build run here on the very files it copies.

No Docker engine runs here, so the image is never built; instead the build
stage's ``pip wheel`` command runs on a staging directory holding exactly what
the Dockerfile's COPY lines (and .dockerignore) let in, and the wheel is
installed into a fresh virtualenv to run the console script the ENTRYPOINT
names.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
VALUES = REPO_ROOT / "helm" / "tokenstamp" / "values.yaml"


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    """Upper-case instruction name."""
    argument: str
    """Everything after the keyword, on one line."""


def _instructions() -> list[Instruction]:
    instructions: list[Instruction] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, argument = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), " ".join(argument.split())))
        pending = ""
    return instructions


def _stages() -> dict[str, list[Instruction]]:
    """Instructions by stage name (``FROM ... AS name``)."""
    stages: dict[str, list[Instruction]] = {}
    current: list[Instruction] = []
    for instruction in _instructions():
        if instruction.keyword == "FROM":
            current = []
            stages[instruction.argument.split()[-1]] = current
        current.append(instruction)
    return stages


def _only(stage: list[Instruction], keyword: str) -> list[str]:
    return [i.argument for i in stage if i.keyword == keyword]


def _chart_defaults() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    return values


def test_two_stages_on_slim_python_311():
    (arg,) = [i.argument for i in _instructions() if i.keyword == "ARG"]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim(-\w+)?", arg)
    froms = [i.argument for i in _instructions() if i.keyword == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE} AS runtime"]


def test_runtime_runs_tokenstamp_serve_as_the_charts_non_root_user():
    runtime = _stages()["runtime"]
    security = _chart_defaults()["securityContext"]
    assert _only(runtime, "USER") == [f"{security['runAsUser']}:{security['runAsGroup']}"]
    assert security["runAsUser"] != 0
    (entrypoint,) = _only(runtime, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["tokenstamp", "serve"]
    assert _only(runtime, "STOPSIGNAL") == ["SIGTERM"]


def test_runtime_listens_where_the_chart_expects():
    runtime = _stages()["runtime"]
    ports = _chart_defaults()["ports"]
    assert _only(runtime, "EXPOSE") == [f"{ports['proxy']} {ports['admin']}"]
    env = dict(item.split("=", 1) for arg in _only(runtime, "ENV") for item in shlex.split(arg))
    assert env["TOKENSTAMP_LISTEN"] == f"0.0.0.0:{ports['proxy']}"
    assert env["TOKENSTAMP_ADMIN"] == f"0.0.0.0:{ports['admin']}"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_runtime_installs_only_the_wheel_and_keeps_no_build_tools():
    stages = _stages()
    runtime = stages["runtime"]
    assert _only(runtime, "COPY") == []
    (run,) = _only(runtime, "RUN")
    assert run.startswith("--mount=type=bind,from=build,source=/wheels,target=/wheels ")
    assert "python -m pip install /wheels/tokenstamp-*.whl" in run
    assert "python -m pip uninstall --yes setuptools wheel pip" in run
    everything = " ".join(i.argument for i in _instructions())
    assert not re.search(r"apt-get|apk |gcc|build-essential", everything)
    assert _only(stages["build"], "RUN") == ["python -m pip wheel --no-deps --wheel-dir /wheels ."]


def _copied_paths() -> list[str]:
    """Sources of the build stage's COPY lines."""
    paths: list[str] = []
    for argument in _only(_stages()["build"], "COPY"):
        *sources, _destination = argument.split()
        paths += [s.rstrip("/") for s in sources]
    return paths


def test_dockerignore_admits_exactly_what_is_copied():
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    admitted = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    assert admitted == _copied_paths()
    for path in admitted:
        assert (REPO_ROOT / path).exists(), f"the Dockerfile copies {path}, which is missing"


def test_wheel_build_step_installs_a_working_console_script(tmp_path):
    """The build stage's own command, on the files it copies; the wheel runs `tokenstamp`."""
    context = tmp_path / "context"
    context.mkdir()
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.pyd", ".*_cache")
    for path in _copied_paths():
        source = REPO_ROOT / path
        if source.is_dir():
            shutil.copytree(source, context / path, ignore=ignored)
        else:
            shutil.copy2(source, context / path)

    (command,) = _only(_stages()["build"], "RUN")
    wheels = tmp_path / "wheels"
    argv = [str(wheels) if arg == "/wheels" else arg for arg in shlex.split(command)]
    assert argv[0] == "python"
    argv[0] = sys.executable
    built = subprocess.run(
        argv, cwd=context, capture_output=True, text=True, timeout=110, check=False
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("tokenstamp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "tokenstamp = proxy.cli:main" in archive.read(entry_points).decode()
    assert "proxy/cli.py" in names
    assert "exporters/names.py" in names
    assert not [n for n in names if n.startswith("tests/")]

    # A fresh environment holding the wheel; the dependencies come from this
    # interpreter's site-packages (listed in a .pth file, so its editable
    # install of the repository stays out of sight).
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "dependencies.pth").write_text("\n".join(ours) + "\n", encoding="utf-8")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--no-cache-dir", str(wheel)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    where = subprocess.run(
        [str(python), "-c", "import proxy; print(proxy.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(environment)
    helped = subprocess.run(
        [str(environment / "bin" / "tokenstamp"), "serve", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0, helped.stderr
    for flag in ("--upstream", "--listen", "--admin", "--drain-timeout"):
        assert flag in helped.stdout


@pytest.mark.parametrize("path", ["pyproject.toml", "README.md"])
def test_copied_top_level_files_exist(path):
    assert path in _copied_paths()
    assert (REPO_ROOT / path).is_file()
