"""The Dockerfile: its shape, and its wheel build run here on the very files it copies.

No Docker engine runs here, so the image is never built; instead the build
stage's ``pip wheel`` command runs on a staging directory holding exactly what
the Dockerfile's COPY lines (and .dockerignore) let in, and the wheel is
installed into a fresh virtualenv to run the console script the ENTRYPOINT
names: the pure wheel (``TOKENSTAMP_COMPILE=0``), and the compiled one the image
builds by default (slow: mypyc compiles the per-token modules).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
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


def _hot_modules() -> list[str]:
    """setup.py's list of the modules the compiled build compiles (read, not run)."""
    for node in ast.parse((REPO_ROOT / "setup.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "HOT_MODULES":
            modules: list[str] = ast.literal_eval(node.value)
            return modules
    raise AssertionError("setup.py has no HOT_MODULES")


def _chart_defaults() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    return values


def _global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    args: dict[str, str] = {}
    for i in _instructions():
        if i.keyword == "FROM":
            break
        if i.keyword == "ARG":
            name, _, default = i.argument.partition("=")
            args[name] = default
    return args


def _compile_default() -> str:
    (arg,) = _only(_stages()["build"], "ARG")
    name, _, default = arg.partition("=")
    assert name == "TOKENSTAMP_COMPILE"
    return default


def test_two_stages_on_python_311_of_one_debian_release():
    """Runtime on slim Python; the build on the full image of the same tag (it has a C
    compiler), so the compiled wheel fits the runtime's Python and C library."""
    args = _global_args()
    assert set(args) == {"PYTHON_IMAGE", "BUILD_IMAGE"}
    assert re.fullmatch(r"python:3\.11-slim-\w+", args["PYTHON_IMAGE"])
    assert args["BUILD_IMAGE"] == args["PYTHON_IMAGE"].replace("-slim", "")
    froms = [i.argument for i in _instructions() if i.keyword == "FROM"]
    assert froms == ["${BUILD_IMAGE} AS build", "${PYTHON_IMAGE} AS runtime"]
    assert _compile_default() == "1"  # the compiled build by default, measured faster


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
    assert "proxy.hot_path_build()" in run  # the build log says which build the image has
    assert "python -m pip uninstall --yes setuptools wheel pip" in run
    everything = " ".join(i.argument for i in _instructions())
    assert not re.search(r"apt-get|apk |gcc|build-essential", everything)
    assert _only(stages["build"], "RUN")[-1] == (
        "python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels ."
    )


def test_build_environment_has_the_dependencies_and_a_pinned_mypy(tmp_path):
    """The first build step lists exactly pyproject's dependencies, then installs them with
    the tools the compiled build needs (no build isolation: mypyc must see their types)."""
    listing, install = _only(_stages()["build"], "RUN")[0].split(" && ")
    command, _, requirements = listing.partition(" > ")
    assert requirements == "/tmp/requirements.txt"
    argv = shlex.split(command)
    assert argv[0] == "python"
    listed = subprocess.run([sys.executable, *argv[1:]], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, check=True).stdout.splitlines()  # fmt: skip
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert listed == project["project"]["dependencies"]
    words = shlex.split(install)
    assert words[:6] == ["python", "-m", "pip", "install", "-r", requirements]
    assert "setuptools>=68" in words
    assert any(re.fullmatch(r"mypy==\d+\.\d+\.\d+", w) for w in words)


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


def _environment(where: Path, *, with_build_tools: bool = False) -> Path:
    """A fresh virtualenv whose dependencies come from this interpreter's site-packages
    (listed in a .pth file, so its editable install of the repository stays out of sight);
    with the build tools the build stage's first step installs beside them. Its python."""
    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "dependencies.pth").write_text("\n".join(ours) + "\n", encoding="utf-8")
    if with_build_tools:
        install = shlex.split(_only(_stages()["build"], "RUN")[0].split(" && ")[1])
        tools = [w for w in install[6:] if not w.startswith("mypy")]  # mypy: this one's
        added = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *tools],
            capture_output=True, text=True, timeout=110, check=False,
        )  # fmt: skip
        assert added.returncode == 0, added.stdout + added.stderr
    return python


def _build_and_run(tmp_path: Path, compile_flag: str) -> None:
    """The build stage's wheel command on the files it copies, with ``TOKENSTAMP_COMPILE``
    as the build argument sets it; the wheel, in a fresh environment, runs `tokenstamp`."""
    context = tmp_path / "context"
    context.mkdir()
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.pyd", ".*_cache")
    for path in _copied_paths():
        source = REPO_ROOT / path
        if source.is_dir():
            shutil.copytree(source, context / path, ignore=ignored)
        else:
            shutil.copy2(source, context / path)

    command = _only(_stages()["build"], "RUN")[-1]
    wheels = tmp_path / "wheels"
    argv = [str(wheels) if arg == "/wheels" else arg for arg in shlex.split(command)]
    assert argv[0] == "python"
    argv[0] = str(_environment(tmp_path / "build-env", with_build_tools=True))
    env = {**os.environ, "TOKENSTAMP_COMPILE": compile_flag}  # a build ARG is in RUN's env
    built = subprocess.run(
        argv, cwd=context, env=env, capture_output=True, text=True, timeout=840, check=False
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("tokenstamp-*.whl")
    compiled = compile_flag == "1"
    assert wheel.name.endswith("-cp311-cp311-linux_x86_64.whl" if compiled else "-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "tokenstamp = proxy.cli:main" in archive.read(entry_points).decode()
    assert "proxy/cli.py" in names
    assert "exporters/names.py" in names
    assert not [n for n in names if n.startswith("tests/")]
    extensions = {n.split(".")[0] + ".py" for n in names if n.endswith(".so")}
    assert extensions >= (set(_hot_modules()) if compiled else set())
    assert compiled or not extensions

    # A fresh environment holding the wheel.
    environment = tmp_path / "venv"
    python = _environment(environment)
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
    build = subprocess.run(
        [str(python), "-c", "import proxy; print(proxy.hot_path_build())"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert build.stdout.strip() == ("compiled" if compiled else "pure")
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


def test_pure_wheel_build_step_installs_a_working_console_script(tmp_path):
    """``--build-arg TOKENSTAMP_COMPILE=0``: the pure wheel, what pip builds from the source."""
    _build_and_run(tmp_path, "0")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_default_compiled_wheel_build_step_installs_a_working_console_script(tmp_path):
    """The image's default: the per-token modules compiled by mypyc, from this interpreter
    (which has the dependencies and mypy, as the build stage's first step installs)."""
    _build_and_run(tmp_path, _compile_default())


@pytest.mark.parametrize("path", ["pyproject.toml", "README.md"])
def test_copied_top_level_files_exist(path):
    assert path in _copied_paths()
    assert (REPO_ROOT / path).is_file()
