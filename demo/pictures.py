"""Pictures of a recorded timeline: a PNG (matplotlib) and a self-contained HTML page.

Both draw a timeline snapshot (``TimelineBuffer.snapshot``, the feed's JSON)
the way ``/timeline`` does: one row per stream, a tick per token, the prefill
window as a bar (culprits in orange), stalls shaded by cause, a reasoning
model's thinking and answering apart (violet, then green). The HTML file is
the live page itself with its script, style and data inlined: it opens from
disk, offline, with hover and zoom.

matplotlib is optional (``pip install 'tokenstamp[pictures]'``): without it
``write_png`` raises ``PicturesUnavailable`` and the HTML is still written.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from proxy.core.records import Backend, PrefillRecord, RequestRecord, StallRecord
from proxy.timeline.buffer import TimelineBuffer, TimelineSettings
from proxy.timeline.tokenlog import Timeline
from proxy.timeline.web import read_asset

COLORS = {
    "tick": "#2b3445",
    "prefill": "#9db4dd",
    "culprit": "#e8590c",
    "stall": "#f03e3e",
    "unattributed": "#868e96",
    "reasoning": "#ae3ec9",
    "answer": "#2f9e44",
    "tick_reasoning": "#862e9c",
    "zebra": "#f6f8fb",
    "life": "#d7dde6",
    "muted": "#6b7482",
}
"""The page's colours (``proxy/static/timeline.css``), shared by the PNG."""


CLOSE_UP_US = (-400_000, 900_000)
"""A run's close-up: from 0.4 s before its key request is forwarded to 0.9 s after."""


class PicturesUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def static_data(
    snapshots: Sequence[dict[str, Any]],
    *,
    title: str,
    view_us: tuple[int, int] | None = None,
    zero_us: int | None = None,
) -> dict[str, Any]:
    """A recorded page's data: backend snapshots (``TimelineBuffer.snapshot``) as one feed
    message, with a title and optionally a close-up and a time zero."""
    data: dict[str, Any] = {
        "type": "snapshot",
        "now_us": max((s["now_us"] for s in snapshots), default=0),
        "window_s": max((s["window_s"] for s in snapshots), default=0),
        "backends": list(snapshots),
    }
    data["title"] = title
    if view_us is not None:
        data["view"] = {"from_us": view_us[0], "to_us": view_us[1]}
    if zero_us is not None:
        data["zero_us"] = zero_us
    return data


def replay_snapshot(
    backend: Backend,
    timelines: Iterable[Timeline],
    *,
    stalls: Iterable[StallRecord] = (),
    prefills: Iterable[PrefillRecord] = (),
    requests: Iterable[RequestRecord] = (),
) -> dict[str, Any]:
    """The snapshot a ``TimelineBuffer`` would have held after a run, rebuilt afterwards
    from a ``TokenLog``'s timelines and the records its sink kept (none dropped)."""
    timelines = [t for t in timelines if t.forwarded_ns is not None]
    if not timelines:
        raise ValueError("replay_snapshot: no forwarded request to draw")
    start_ns = min(t.forwarded_ns or 0 for t in timelines)
    end_ns = max(t.end_ns or (t.token_ns[-1] if t.token_ns else 0) for t in timelines)
    longest = max(len(t.token_ns) for t in timelines)
    settings = TimelineSettings(
        window_s=(end_ns - start_ns) / 1e9 + 1.0,
        max_streams=len(timelines),
        max_ticks=max(longest, 1),
        max_stalls=1 << 20,
        max_prefills=1 << 20,
    )
    buf = TimelineBuffer(backend, settings, origin_ns=start_ns)
    for t in sorted(timelines, key=lambda t: t.forwarded_ns or 0):
        buf.forwarded(t.request_id, t.forwarded_ns or 0)
        if t.token_ns:
            buf.first_token(t.request_id, t.token_ns[0])
            for a, b in itertools.pairwise(t.token_ns):
                buf.gap(t.request_id, a, b)
        if t.end_ns is not None:
            buf.finished(t.request_id, t.end_ns)
    for p in prefills:
        buf.prefill_done(p)
    for st in stalls:
        buf.stall(st)
    for r in requests:
        buf.request_finished(r)
    return buf.snapshot(end_ns)


def html_page(data: dict[str, Any]) -> str:
    """The timeline page with its style, script and ``data`` inlined (opens offline)."""
    page = read_asset("timeline.html")
    css = read_asset("timeline.css")
    js = read_asset("timeline.js")
    # "</" may not appear inside a <script> element; JSON allows "\/" for "/".
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    style_tag = '<link rel="stylesheet" href="timeline/timeline.css">'
    script_tag = '<script src="timeline/timeline.js"></script>'
    if style_tag not in page or script_tag not in page:
        raise RuntimeError("timeline.html: the style or script tag to inline is missing")
    page = page.replace(style_tag, f"<style>\n{css}</style>")
    if "</script" in js.lower():
        raise RuntimeError("timeline.js: may not contain a closing script tag")
    inline = (
        f'<script id="timeline-data" type="application/json">{payload}</script>\n'
        f"<script>\n{js}</script>"
    )
    return page.replace(script_tag, inline)


def write_html(data: dict[str, Any], path: Path) -> Path:
    """Write ``html_page(data)`` to ``path``."""
    path.write_text(html_page(data), encoding="utf-8")
    return path


def _rows(backend: dict[str, Any], lo_us: float, hi_us: float) -> list[dict[str, Any]]:
    rows = [
        s
        for s in backend["streams"]
        if s["forwarded_us"] <= hi_us and (s["end_us"] is None or s["end_us"] >= lo_us)
    ]
    rows.sort(key=lambda s: (s["forwarded_us"], s["id"]))
    return rows


def _culprits(backend: dict[str, Any]) -> dict[str, int]:
    """Culprit id -> streams it stalled."""
    out = {
        p["request_id"]: p["stalled_streams"] for p in backend["prefills"] if p["stalled_streams"]
    }
    for st in backend["stalls"]:
        for c in st["culprits"]:
            out.setdefault(c, 0)
    return out


def _reasoning_tick(stream: dict[str, Any], tick_us: int) -> bool:
    """True for a tick of a reasoning stream before its first answer event."""
    if stream.get("reasoning_us") is None:
        return False
    answer = stream.get("answer_us")
    return answer is None or tick_us < answer


def write_png(data: dict[str, Any], path: Path, *, dpi: int = 120) -> Path:
    """Draw the first backend of ``data`` (a ``static_data`` dict) as a PNG at ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.collections import LineCollection
        from matplotlib.colors import to_rgba
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise PicturesUnavailable(
            "PNG pictures need matplotlib: pip install 'tokenstamp[pictures]'"
        ) from exc

    backend = data["backends"][0]
    view = data.get("view")
    if view is not None:
        lo_us, hi_us = float(view["from_us"]), float(view["to_us"])
    else:
        ends = [s["end_us"] or s["forwarded_us"] for s in backend["streams"]]
        lo_us = float(min((s["forwarded_us"] for s in backend["streams"]), default=0))
        hi_us = float(max(ends, default=lo_us + 1))
    zero = float(data.get("zero_us", lo_us))
    rows = _rows(backend, lo_us, hi_us)
    index = {s["id"]: i for i, s in enumerate(rows)}
    culprits = _culprits(backend)

    def sec(us: float) -> float:
        return (us - zero) / 1e6

    height = 1.5 + 0.17 * max(len(rows), 4)
    fig, ax = plt.subplots(figsize=(12, height), dpi=dpi)
    ax.set_xlim(sec(lo_us), sec(hi_us))
    ax.set_ylim(len(rows) - 0.5, -0.5)
    for i, s in enumerate(rows):
        if i % 2:
            ax.axhspan(i - 0.5, i + 0.5, color=COLORS["zebra"], lw=0, zorder=0)
        end = s["end_us"] if s["end_us"] is not None else hi_us
        ax.plot([sec(s["forwarded_us"]), sec(end)], [i, i], color=COLORS["life"], lw=0.6, zorder=1)
        first = s["first_token_us"] if s["first_token_us"] is not None else end
        culprit = s["id"] in culprits
        half = 0.42 if culprit else 0.22
        ax.broken_barh(
            [(sec(s["forwarded_us"]), max(sec(first) - sec(s["forwarded_us"]), 1e-4))],
            (i - half, 2 * half),
            color=COLORS["culprit" if culprit else "prefill"],
            zorder=2,
        )
        if s.get("reasoning_us") is not None:
            answer = s.get("answer_us")
            think_end = end if answer is None else answer
            ax.broken_barh(
                [(sec(s["reasoning_us"]), max(sec(think_end) - sec(s["reasoning_us"]), 1e-4))],
                (i - 0.5, 1.0),
                facecolor=to_rgba(COLORS["reasoning"], 0.22),
                lw=0,
                zorder=2,
            )
            if answer is not None and end > answer:
                ax.broken_barh(
                    [(sec(answer), sec(end) - sec(answer))],
                    (i - 0.5, 1.0),
                    facecolor=to_rgba(COLORS["answer"], 0.22),
                    lw=0,
                    zorder=2,
                )
    for st in backend["stalls"]:
        row = index.get(st["stream"])
        if row is None:
            continue
        color = COLORS["stall" if st["cause"] == "prefill" else "unattributed"]
        ax.broken_barh(
            [(sec(st["start_us"]), sec(st["end_us"]) - sec(st["start_us"]))],
            (row - 0.5, 1.0),
            facecolor=to_rgba(color, 0.38),
            edgecolor=color,
            lw=0.6,
            zorder=3,
        )
    segments = [
        [(sec(t), i - 0.36), (sec(t), i + 0.36)]
        for i, s in enumerate(rows)
        for t in s["ticks_us"]
        if lo_us <= t <= hi_us
    ]
    colors = [
        COLORS["tick_reasoning" if _reasoning_tick(s, t) else "tick"]
        for s in rows
        for t in s["ticks_us"]
        if lo_us <= t <= hi_us
    ]
    ax.add_collection(LineCollection(segments, colors=colors, linewidths=0.8, zorder=4))

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([s["id"] for s in rows], fontsize=7)
    for label, s in zip(ax.get_yticklabels(), rows, strict=True):
        if s["id"] in culprits:
            label.set_color(COLORS["culprit"])
            label.set_fontweight("bold")
            i = index[s["id"]]
            n = culprits[s["id"]]
            at = s["first_token_us"] if s["first_token_us"] is not None else s["forwarded_us"]
            ax.annotate(
                f"culprit: {n} stream{'s' if n != 1 else ''} stalled",
                (sec(at), i),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                fontweight="bold",
                color=COLORS["culprit"],
                bbox={"boxstyle": "square,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.9},
                zorder=6,
            )
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=8, colors=COLORS["muted"])
    ax.set_xlabel(data.get("x_label", "seconds"), fontsize=8, color=COLORS["muted"])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#edf0f4", lw=0.8, zorder=0)
    ax.set_axisbelow(True)
    reasoned = any(s.get("reasoning_us") is not None for s in rows)
    phases = [
        Patch(fc=to_rgba(COLORS["reasoning"], 0.22), ec=COLORS["reasoning"], label="reasoning"),
        Patch(fc=to_rgba(COLORS["answer"], 0.22), ec=COLORS["answer"], label="answer"),
    ]
    handles = [
        Line2D([0], [0], color=COLORS["tick"], lw=1.2, label="token"),
        Patch(color=COLORS["prefill"], label="prefill window"),
        Patch(color=COLORS["culprit"], label="culprit prefill"),
        Patch(
            fc=to_rgba(COLORS["stall"], 0.38), ec=COLORS["stall"], label="stall caused by a prefill"
        ),
        Patch(
            fc=to_rgba(COLORS["unattributed"], 0.38),
            ec=COLORS["unattributed"],
            label="stall, no culprit",
        ),
        *(phases if reasoned else []),
    ]
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0, 1.0),
        ncol=len(handles),
        frameon=False,
        fontsize=8,
    )
    fig.suptitle(
        data.get("title", ""), x=0.01, y=1 - 0.12 / height, ha="left", va="top", fontsize=11,
        fontweight="bold",
    )  # fmt: skip
    top = 1 - 0.25 / height  # below the title (and the subtitle); the legend fits in too
    if data.get("subtitle"):
        fig.text(
            0.01, 1 - 0.38 / height, data["subtitle"], ha="left", va="top", fontsize=9,
            color=COLORS["muted"],
        )  # fmt: skip
        top -= 0.2 / height
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path)
    plt.close(fig)
    return path


def write_run_pictures(
    snapshot: dict[str, Any],
    stem: Path,
    *,
    title: str,
    zero_id: str,
    x_label: str,
    subtitle: str = "",
    close_up_us: tuple[int, int] = CLOSE_UP_US,
) -> dict[str, str | None]:
    """``<stem>.html`` and ``<stem>.png`` of one backend's snapshot; time zero and close-up
    at request ``zero_id``. Returns both paths; ``png`` is ``None`` without matplotlib.
    """
    zero = next(s["forwarded_us"] for s in snapshot["streams"] if s["id"] == zero_id)
    data = static_data(
        [snapshot],
        title=title,
        view_us=(zero + close_up_us[0], zero + close_up_us[1]),
        zero_us=zero,
    )
    data["x_label"] = x_label
    data["subtitle"] = subtitle
    stem.parent.mkdir(parents=True, exist_ok=True)
    html = write_html(data, stem.with_suffix(".html"))
    try:
        png: Path | None = write_png(data, stem.with_suffix(".png"))
    except PicturesUnavailable:
        png = None
    return {"png": None if png is None else str(png), "html": str(html)}


def pictures_report(runs: dict[str, dict[str, str | None] | None]) -> str:
    """Lines naming each run's picture files (for the demo's output)."""
    lines = ["Pictures of the runs, as /timeline shows them (the HTML opens offline):"]
    missing_png = False
    for label, pics in runs.items():
        if not pics:
            continue
        for kind in ("png", "html"):
            if pics[kind]:
                lines.append(f"  {label:10} {pics[kind]}")
        missing_png = missing_png or pics["png"] is None
    if missing_png:
        lines.append("  (PNG pictures need matplotlib: pip install 'tokenstamp[pictures]')")
    return "\n".join(lines)
