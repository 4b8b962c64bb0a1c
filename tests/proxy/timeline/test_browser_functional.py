"""``/timeline`` in a real headless browser, in front of the simulator's unchunked seed scenario.

Debian's ``chromium`` is driven over the DevTools protocol (a websocket,
through aiohttp). The proxy runs with ``--timeline`` in front of the simulator
(seed profile, unchunked); the page is opened before the load starts; 40
streams decode and one 4,000-token prompt arrives. The page must draw, on the
stalled streams' rows, a band caused by that prompt exactly where the
simulator's ground truth puts its prefill; hovering the culprit must show its
metadata; the console must stay clean. Screenshots go to
``artifacts/timeline/`` (git-ignored) to be looked at.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from demo.pictures import static_data, write_html
from demo.scenarios import chat_body, run_stutter, stream
from proxy.config import HostPort, ProxyConfig
from proxy.edge.server import start_proxy
from proxy.timeline.tokenlog import TokenLog
from tests.demo.test_pictures import synthetic

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts" / "timeline"
WIDTH, HEIGHT = 1400, 900
STREAMS = 40
LONG_ID = "unchunked-long-prompt"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    f"--window-size={WIDTH},{HEIGHT}",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


class Page:
    """One page over the DevTools protocol; remembers console errors and exceptions."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.errors: list[str] = []

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(json.dumps(params.get("args"))[:500])
        elif method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params.get("exceptionDetails"))[:500])
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(params["entry"].get("text", "")[:500])

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        await self.ws.send_json({"id": mine, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 30)
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    async def js(self, expression: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float, what: str) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            value = await self.js(expression)
            if value:
                return value
            if loop.time() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        res = await self.call("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(res["data"]))


@contextlib.asynccontextmanager
async def chromium(tmp_path: Path) -> AsyncIterator[Page]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (make deps-system)")
    proc = await asyncio.create_subprocess_exec(
        exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "about:blank",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    drain: asyncio.Task[bytes] | None = None
    try:
        assert proc.stderr is not None
        browser_ws = ""
        async with asyncio.timeout(30):
            while not browser_ws:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    raise AssertionError("chromium exited before its DevTools endpoint was up")
                if "DevTools listening on " in line:
                    browser_ws = line.split("DevTools listening on ", 1)[1].strip()
        drain = asyncio.get_running_loop().create_task(proc.stderr.read())  # keep the pipe empty
        http = browser_ws.split("/devtools/")[0].replace("ws://", "http://")
        async with aiohttp.ClientSession() as session:
            async with session.get(http + "/json/list") as r:
                targets = await r.json()
            page_ws = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
            async with session.ws_connect(page_ws, max_msg_size=64 << 20) as ws:
                page = Page(ws)
                for domain in ("Page", "Runtime", "Log"):
                    await page.call(f"{domain}.enable")
                await page.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False,
                )  # fmt: skip
                yield page
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drain is not None:
            await drain  # ends with the process's stderr


def band_right_edge(state: dict[str, Any]) -> float:
    x = state["backends"][0]["x"]
    return x["left_px"] + x["width_px"]


def _pixel(canvas_index: int, x: float, y: float) -> str:
    return (
        f"Array.from(document.querySelectorAll('canvas.main')[{canvas_index}]"
        f".getContext('2d').getImageData({int(x)}, {int(y)}, 1, 1).data)"
    )


@contextlib.asynccontextmanager
async def simulator(ground_truth: Path, *options: str) -> AsyncIterator[str]:
    """The simulator (seed, unchunked) in its own process, as the demo runs it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "simulate", "--listen", f"127.0.0.1:{port}",
        "--profile", "seed", "--chunk-size", "none", "--ground-truth", str(ground_truth),
        "--nice", "-10", *options,
        stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(400):
                assert proc.returncode is None, "the simulator exited"
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/health") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.025)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


@dataclass
class Seen:
    """What the page showed, read while the browser was open."""

    state: dict[str, Any]
    pixels: list[list[int]]
    tip: str
    errors: list[str]
    console: list[str]


async def _look(page: Page, proxy_url: str, log: TokenLog) -> Seen:
    load = asyncio.get_running_loop().create_task(
        run_stutter(proxy_url, log, label="unchunked", streams=STREAMS, prompt_tokens=4000)
    )
    try:
        await page.wait_for(
            "(window.__timelineState.backends[0] || {bands: []}).bands.filter(b =>"
            f" b.culprits.includes('{LONG_ID}') && b.x1 < window.__timelineState.backends[0]"
            f".x.left_px + window.__timelineState.backends[0].x.width_px).length >= {STREAMS // 2}",
            40,
            "the long prompt's stall bands",
        )
        await page.js("document.getElementById('pause').click()")
        state = await page.wait_for(
            "window.__timelineState.paused && window.__timelineState", 5, "pause"
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(ARTIFACTS / "timeline-unchunked.png")
        # The canvas pixel in the middle of each band, as painted.
        pixels = []
        for band in state["backends"][0]["bands"]:
            if LONG_ID in band["culprits"] and band["x1"] < band_right_edge(state):
                cx, cy = (band["x0"] + band["x1"]) / 2, (band["y0"] + band["y1"]) / 2
                pixels.append(await page.js(_pixel(0, cx, cy)))
        # Hover the culprit's prefill bar: its metadata, its stalls linked to it.
        bar = next(b for b in state["backends"][0]["culprit_bars"] if b["stream"] == LONG_ID)
        canvas = state["backends"][0]["canvas"]
        scroll_y = await page.js("window.scrollY")
        await page.call(
            "Input.dispatchMouseEvent",
            type="mouseMoved",
            x=canvas["left"] + (bar["x0"] + bar["x1"]) / 2,
            y=canvas["top"] - scroll_y + (bar["y0"] + bar["y1"]) / 2,
        )
        tip = await page.wait_for(
            "!document.getElementById('tip').hidden && document.getElementById('tip').textContent",
            5,
            "the tooltip",
        )
        await page.screenshot(ARTIFACTS / "timeline-unchunked-hover.png")
    finally:
        await load
    errors = await page.js("window.__timelineState.errors")
    return Seen(state, pixels, tip, errors, list(page.errors))


@contextlib.asynccontextmanager
async def timeline_page(sim_url: str, tmp_path: Path) -> AsyncIterator[tuple[Any, TokenLog, Any]]:
    """The proxy with its timeline in front of ``sim_url``, and chromium on the page, connected:
    yields (the proxy, its token log, the page)."""
    log = TokenLog()
    config = ProxyConfig(
        upstream=sim_url,
        listen=HostPort("127.0.0.1", 0),
        admin=HostPort("127.0.0.1", 0),
        backend_name="simulator",
        provider="tokenstamp-sim",
        timeline=True,
        timeline_window_s=20.0,
    )
    proxy = await start_proxy(config, watcher=log)
    try:
        assert proxy.timeline is not None
        async with chromium(tmp_path) as page:
            await page.call("Page.navigate", url=proxy.admin_url + "/timeline")
            await page.wait_for(
                "window.__timelineState && window.__timelineState.connected", 15, "the feed"
            )
            yield proxy, log, page
    finally:
        await proxy.close(drain_timeout_s=2.0)


@pytest.mark.timeout(90)
async def test_timeline_page_draws_the_prefill_stall_where_the_ground_truth_puts_it(tmp_path):
    truth_path = tmp_path / "truth.jsonl"
    async with simulator(truth_path) as sim_url:
        async with timeline_page(sim_url, tmp_path) as (proxy, log, page):
            assert proxy.timeline is not None
            origin_ns = proxy.timeline.origin_ns
            seen = await _look(page, proxy.url, log)
    truth = next(
        r
        for r in map(json.loads, truth_path.read_text(encoding="utf-8").splitlines())
        if r["type"] == "prefill" and r["x_request_id"] == LONG_ID
    )

    backend = seen.state["backends"][0]
    assert backend["name"] == "simulator"
    assert LONG_ID in backend["culprits"]
    bands = [b for b in backend["bands"] if LONG_ID in b["culprits"]]
    assert all(b["cause"] == "prefill" for b in bands)
    assert all(b["stream"] != LONG_ID for b in bands)

    # Where the ground truth puts the prefill (the step that computed the prompt),
    # mapped onto the page's own time axis, then onto its own pixels.
    truth_start_us = (truth["start_ns"] - origin_ns) / 1000
    truth_end_us = (truth["end_ns"] - origin_ns) / 1000
    x = backend["x"]

    def px(us: float) -> float:
        return x["left_px"] + (us - x["from_us"]) / (x["to_us"] - x["from_us"]) * x["width_px"]

    slack_us = 20_000  # delivery and stamping on a busy machine; a decode step is ~25 ms
    for b in bands:  # every band pinned on the prompt overlaps its prefill
        assert b["start_us"] <= truth_end_us + slack_us, (b, truth_start_us, truth_end_us)
        assert b["end_us"] >= truth_start_us - slack_us, (b, truth_start_us, truth_end_us)
    # Most of the 40 streams froze for exactly that step: a band over all of it.
    covering = {
        b["stream"]
        for b in bands
        if b["start_us"] <= truth_start_us + slack_us
        and abs(b["end_us"] - truth_end_us) <= slack_us
        and b["x0"] <= px(truth_start_us + slack_us) + 1
        and b["x1"] >= px(truth_end_us - slack_us) - 1
    }
    assert len(covering) >= STREAMS // 2, (bands, x, truth_start_us, truth_end_us)

    # Painted: the stall's translucent red over a white or zebra row, opaque canvas.
    assert seen.pixels
    for red, green, blue, alpha in seen.pixels:
        assert alpha == 255, seen.pixels
        assert red > green + 40, seen.pixels
        assert red > blue + 40, seen.pixels

    assert seen.errors == []
    assert seen.console == []
    assert LONG_ID in seen.tip
    assert "4000" in seen.tip  # the backend's usage count (the body's estimate says 4)
    assert "TTFT" in seen.tip
    assert "culprit" in seen.tip


@pytest.mark.timeout(60)
async def test_recorded_page_opens_offline_with_200_streams_and_hostile_ids_stay_text(tmp_path):
    # 200 streams at 50 tokens/s for 30 s: the "smooth with 200 streams" load.
    buf = synthetic(streams=200, seconds=30.0, step_ms=20)
    snapshot = buf.snapshot(buf.origin_ns + 31 * 1_000_000_000)
    data = static_data([snapshot], title="200 streams", view_us=(0, 31_000_000), zero_us=0)
    path = write_html(data, tmp_path / "recorded.html")
    async with chromium(tmp_path) as page:
        await page.call("Page.navigate", url=path.as_uri())
        state = await page.wait_for(
            "window.__timelineState && window.__timelineState.draws > 0 && window.__timelineState",
            15,
            "the recorded page to draw",
        )
        await page.screenshot(ARTIFACTS / "timeline-recorded-200-streams.png")
        # Redraw a few times (the live page redraws every frame) and keep the slowest.
        draw_ms = await page.js(
            "(() => { let worst = 0; for (let i = 0; i < 5; i++) {"
            " window.dispatchEvent(new Event('resize'));"
            " worst = Math.max(worst, window.__timelineState.last_draw_ms); } return worst; })()"
        )
        inert = await page.js(
            "window.__pwned === undefined && document.querySelectorAll('img').length === 0"
        )
        errors = await page.js("window.__timelineState.errors")
        console = list(page.errors)
    print(f"200 streams x 1,500 tokens: slowest full redraw {draw_ms:.1f} ms")
    assert state["mode"] == "static"
    [backend] = state["backends"]
    assert backend["rows"] == 201
    assert len([b for b in backend["bands"] if b["culprits"] == ["long-prompt"]]) == 200
    assert backend["culprits"] == ["long-prompt"]
    assert inert
    assert errors == []
    assert console == []


THINKERS = {
    # request id: body extensions (the simulator reasons 12 tokens unless told)
    "thinks": {},
    "thinks-long": {"sim_reasoning_tokens": 30, "max_tokens": 110},
    "calls-a-tool": {"sim_reasoning_tokens": 6, "sim_tool_call": True},
    "answers-at-once": {"sim_reasoning_tokens": 0},
}


def thinker_body(extra: dict[str, object]) -> dict[str, object]:
    """A streamed chat request, a short prompt, the output length the simulator's unless given."""
    body = chat_body(prompt_tokens=64, max_tokens=1)
    del body["max_tokens"]
    return {**body, **extra}


def _rgb_read(phase_box: dict[str, float], y: float) -> str:
    return _pixel(0, (phase_box["x0"] + phase_box["x1"]) / 2, y)


@pytest.mark.timeout(90)
async def test_timeline_colours_a_reasoning_streams_two_phases_where_the_truth_puts_them(tmp_path):
    truth_path = tmp_path / "truth.jsonl"
    options = ("--reasoning-tokens", "12", "--output-tokens", "16")
    async with simulator(truth_path, *options) as sim_url:
        async with timeline_page(sim_url, tmp_path) as (proxy, _, page):
            assert proxy.timeline is not None
            origin_ns = proxy.timeline.origin_ns
            async with aiohttp.ClientSession() as session:
                load = asyncio.gather(
                    *(
                        stream(session, proxy.url, thinker_body(extra), rid)
                        for rid, extra in THINKERS.items()
                    )
                )
                # Live, before it ends: the long thinker's answer began, its phases show.
                live = await page.wait_for(
                    "(window.__timelineState.backends[0] || {phases: []}).phases.find(p =>"
                    " p.stream === 'thinks-long' && p.open && p.answer)",
                    30,
                    "the long thinker's answer, live",
                )
                await load
            state = await page.wait_for(
                "(() => { const st = window.__timelineState; const b = st.backends[0];"
                " return b && b.phases.length === 3 && b.phases.every(p => !p.open) && st; })()",
                10,
                "every stream's phases, finished",
            )
            await page.js("document.getElementById('pause').click()")
            state = await page.wait_for(
                "window.__timelineState.paused && window.__timelineState", 5, "pause"
            )
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await page.screenshot(ARTIFACTS / "timeline-reasoning.png")
            phases = {p["stream"]: p for p in state["backends"][0]["phases"]}
            pixels = {}
            for rid, p in phases.items():
                # The row's top edge: under the band, above the ticks.
                pixels[rid] = (
                    await page.js(_rgb_read(p["reasoning"], p["y0"] + 1)),
                    None
                    if p["answer"] is None
                    else await page.js(_rgb_read(p["answer"], p["y0"] + 1)),
                )
            errors = await page.js("window.__timelineState.errors")
            console = list(page.errors)
    truth = [json.loads(line) for line in truth_path.read_text(encoding="utf-8").splitlines()]
    first_answer = {r["x_request_id"]: r["first_answer_ns"] for r in truth if r["type"] == "finish"}
    first_token = {r["x_request_id"]: r["end_ns"] for r in truth if r["type"] == "prefill"}

    assert live["answer"] is not None
    assert errors == []
    assert console == []
    # Only the streams that reasoned have two phases; the one that answered at once has none.
    assert set(phases) == {"thinks", "thinks-long", "calls-a-tool"}
    x = state["backends"][0]["x"]

    def px(ns: int) -> float:
        us = (ns - origin_ns) / 1000
        return x["left_px"] + (us - x["from_us"]) / (x["to_us"] - x["from_us"]) * x["width_px"]

    slack_px = 0.020 * 1e6 / (x["to_us"] - x["from_us"]) * x["width_px"] + 1  # 20 ms
    for rid, p in phases.items():
        # Reasoning from the first token to the first answer token, as the engine emitted them.
        assert abs(p["reasoning"]["x0"] - px(first_token[rid])) <= slack_px, (rid, p)
        assert abs(p["reasoning"]["x1"] - px(first_answer[rid])) <= slack_px, (rid, p)
        assert p["answer"] is not None
        assert abs(p["answer"]["x0"] - px(first_answer[rid])) <= slack_px, (rid, p)
        reasoning, answer = pixels[rid]
        assert violet(reasoning), (rid, reasoning)
        assert green(answer), (rid, answer)


def violet(rgba: list[int]) -> bool:
    """The reasoning band over a white or zebra row, as painted (opaque canvas)."""
    red, green, blue, alpha = rgba
    return alpha == 255 and blue > green + 20 and red > green + 15


def green(rgba: list[int] | None) -> bool:
    """The answer band over a white or zebra row."""
    if rgba is None:
        return False
    red, green, blue, alpha = rgba
    return alpha == 255 and green > red + 15 and green > blue + 10
