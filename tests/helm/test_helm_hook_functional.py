"""The `helm test` pod's check, run against the real proxy started with the chart's flags."""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from proxy.config import config_from_argv
from proxy.edge.server import RunningProxy, start_proxy


def _rendered_container(harness) -> tuple[list[str], list[str]]:
    """(the hook pod's command, the tokenstamp container's args) of the standalone scenario."""
    values = harness.load_values(harness.scenarios["standalone"])
    rendered = harness.render(values)
    (hook,) = rendered.all("Pod")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (check,) = hook["spec"]["containers"]
    containers = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    (proxy,) = containers
    return check["command"], proxy["args"]


async def _start_with_chart_args(args: list[str], upstream: str) -> RunningProxy:
    """The proxy as the chart configures it, on loopback ports and a local upstream."""
    local = {"upstream": upstream, "listen": "127.0.0.1:0", "admin": "127.0.0.1:0"}
    argv = []
    for arg in args:
        flag = arg.removeprefix("--").split("=", 1)[0]
        argv.append(f"--{flag}={local[flag]}" if flag in local else arg)
    return await start_proxy(config_from_argv(argv, env={}))


async def _run_hook(command: list[str], admin_url: str) -> tuple[int, str]:
    """The pod's command with this interpreter, the Service URL swapped for the local admin."""
    python, dash_c, script, _service_url = command
    assert (python, dash_c) == ("python", "-c")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        admin_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_hook_passes_against_a_ready_proxy_and_fails_while_it_drains(harness, aiohttp_server):
    command, args = _rendered_container(harness)
    upstream = await aiohttp_server(web.Application(), host="127.0.0.1")
    proxy = await _start_with_chart_args(args, str(upstream.make_url("")).rstrip("/"))
    try:
        code, output = await _run_hook(command, proxy.admin_url)
        assert code == 0, output
        assert output.splitlines() == ["/readyz: ok", "/metrics: ok"]

        proxy.state.draining = True
        code, output = await _run_hook(command, proxy.admin_url)
        assert code != 0
        assert output.startswith("/readyz: HTTP 503"), output
    finally:
        await proxy.close(drain_timeout_s=0)


async def test_hook_fails_while_the_upstream_is_down(harness, aiohttp_server):
    command, args = _rendered_container(harness)
    upstream = await aiohttp_server(web.Application(), host="127.0.0.1")
    url = str(upstream.make_url("")).rstrip("/")
    await upstream.close()
    proxy = await _start_with_chart_args(args, url)
    try:
        code, output = await _run_hook(command, proxy.admin_url)
        assert code != 0
        assert output.startswith("/readyz: HTTP 503"), output
    finally:
        await proxy.close(drain_timeout_s=0)
