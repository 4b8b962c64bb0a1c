"""Pictures of a recorded timeline: the PNG (matplotlib) and the self-contained HTML page."""

from __future__ import annotations

import json
import re
import struct

from demo.pictures import (
    html_page,
    replay_snapshot,
    static_data,
    write_png,
    write_run_pictures,
)
from proxy.core.records import Backend, PrefillRecord, RequestLabels, StallCause, StallRecord
from proxy.timeline.buffer import TimelineBuffer, TimelineSettings
from proxy.timeline.tokenlog import FanoutWatcher, TokenLog

MS = 1_000_000
BACKEND = Backend("tokenstamp-sim", "simulator")
ORIGIN = 5_000_000 * MS
EVIL_ID = '</script><img src=x onerror="window.__pwned=1">'


def synthetic(
    streams: int = 12, seconds: float = 2.0, step_ms: int = 25, long_id: str = "long-prompt"
) -> TimelineBuffer:
    """``streams`` streams decoding one token a step; ``long_id``'s prefill freezes them all
    for one 150 ms step at 1 s; one stream's id is hostile markup."""
    buf = TimelineBuffer(BACKEND, TimelineSettings(window_s=60), origin_ns=ORIGIN)
    prefill_at, prefill_ns = ORIGIN + 1000 * MS, 150 * MS
    ids = [f"stream-{i:03d}" for i in range(streams - 1)] + [EVIL_ID]
    frozen: dict[str, int] = {}  # stream -> its last token before the prefill
    for n, rid in enumerate(ids):
        buf.forwarded(rid, ORIGIN + n * MS)
        t, last = ORIGIN + 60 * MS + n * MS, None
        while t < ORIGIN + int(seconds * 1e9):
            if last is None:
                buf.first_token(rid, t)
            else:
                buf.gap(rid, last, t)
            last = t
            if last < prefill_at <= last + step_ms * MS:
                frozen[rid] = last
                t += prefill_ns
            else:
                t += step_ms * MS
        buf.finished(rid, last or t)
    buf.forwarded(long_id, prefill_at - 5 * MS)
    buf.first_token(long_id, prefill_at + prefill_ns)
    buf.finished(long_id, prefill_at + prefill_ns + 40 * MS)
    for rid, start in frozen.items():
        buf.stall(
            StallRecord(
                request_id=rid,
                backend=BACKEND,
                start_ns=start,
                end_ns=start + prefill_ns,
                baseline_ns=step_ms * MS,
                threshold_ns=3 * step_ms * MS,
                cause=StallCause.PREFILL,
                culprits=(long_id,),
            )
        )
    stalled = len(frozen)
    buf.prefill_done(
        PrefillRecord(
            request_id=long_id,
            labels=RequestLabels("chat", "sim", BACKEND),
            forwarded_ns=prefill_at - 5 * MS,
            first_token_ns=prefill_at + prefill_ns,
            prompt_tokens_hint=4000,
            stalls=stalled,
            stalled_streams=stalled,
            stutter_cost_s=stalled * 0.125,
        )
    )
    return buf


def test_html_page_inlines_everything_and_keeps_ids_inert():
    buf = synthetic()
    data = static_data([buf.snapshot(ORIGIN + 3000 * MS)], title="run </script> one")
    page = html_page(data)
    assert "timeline/timeline.js" not in page  # inlined, not linked
    assert "timeline/timeline.css" not in page
    assert not re.search(r"https?://", page)
    # The only closing script tags are the two real ones: data cannot end its element.
    assert page.lower().count("</script") == 2
    payload = page.split('<script id="timeline-data" type="application/json">', 1)[1]
    payload = payload.split("</script>", 1)[0]
    decoded = json.loads(payload)
    assert decoded["title"] == "run </script> one"
    assert EVIL_ID in {s["id"] for s in decoded["backends"][0]["streams"]}


def png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_png_is_drawn(tmp_path):
    buf = synthetic(streams=40)
    data = static_data([buf.snapshot(ORIGIN + 3000 * MS)], title="forty streams")
    width, height = png_size(write_png(data, tmp_path / "t.png", dpi=100))
    assert width == 1200  # 12 inches at 100 dpi
    assert height > 600  # a row per stream


def test_run_pictures_write_both_files_with_the_close_up(tmp_path):
    buf = synthetic()
    out = write_run_pictures(
        buf.snapshot(ORIGIN + 3000 * MS),
        tmp_path / "pics" / "timeline-unchunked",
        title="unchunked",
        zero_id="long-prompt",
        x_label="seconds since the long prompt was forwarded",
    )
    assert out["png"] == str(tmp_path / "pics" / "timeline-unchunked.png")
    assert out["html"] == str(tmp_path / "pics" / "timeline-unchunked.html")
    png_size(tmp_path / "pics" / "timeline-unchunked.png")
    html = (tmp_path / "pics" / "timeline-unchunked.html").read_text(encoding="utf-8")
    data = json.loads(html.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    zero = data["zero_us"]
    assert data["view"] == {"from_us": zero - 400_000, "to_us": zero + 900_000}


def test_replay_draws_what_the_live_buffer_held():
    """The demo's pictures come from its records afterwards: the same snapshot as live."""
    live = TimelineBuffer(BACKEND, TimelineSettings(window_s=60), origin_ns=ORIGIN)
    log = TokenLog()
    both = FanoutWatcher(live, log)
    both.forwarded("a", ORIGIN)
    both.forwarded("long", ORIGIN + 5 * MS)
    both.first_token("a", ORIGIN + 10 * MS)
    both.gap("a", ORIGIN + 10 * MS, ORIGIN + 35 * MS)
    both.gap("a", ORIGIN + 35 * MS, ORIGIN + 190 * MS)
    both.first_token("long", ORIGIN + 189 * MS)
    both.finished("long", ORIGIN + 200 * MS)
    both.finished("a", ORIGIN + 210 * MS)
    stall = StallRecord(
        request_id="a",
        backend=BACKEND,
        start_ns=ORIGIN + 35 * MS,
        end_ns=ORIGIN + 190 * MS,
        baseline_ns=25 * MS,
        threshold_ns=75 * MS,
        cause=StallCause.PREFILL,
        culprits=("long",),
    )
    pre = PrefillRecord(
        request_id="long",
        labels=RequestLabels("chat", "sim", BACKEND),
        forwarded_ns=ORIGIN + 5 * MS,
        first_token_ns=ORIGIN + 189 * MS,
        prompt_tokens_hint=4000,
        stalls=1,
        stalled_streams=1,
        stutter_cost_s=0.13,
    )
    live.stall(stall)
    live.prefill_done(pre)
    replayed = replay_snapshot(BACKEND, log.timelines.values(), stalls=[stall], prefills=[pre])
    expected = live.snapshot(ORIGIN + 210 * MS)
    assert replayed["streams"] == expected["streams"]
    assert replayed["stalls"] == expected["stalls"]
    assert replayed["prefills"] == expected["prefills"]
