/* tokenstamp timeline: every stream of a backend as a row of token ticks over time.
 *
 * Live: reads the admin server's feed (server-sent events at "timeline/feed"): a
 * snapshot, then deltas. Static: reads the JSON in <script id="timeline-data">
 * (a demo picture). Plain canvas, no dependencies, nothing fetched from outside.
 * Request ids come from clients: they only ever reach the page as textContent.
 * window.__timelineState is a small summary for tests and the curious.
 */
(() => {
  "use strict";

  const C = {
    tick: "#2b3445",
    tickDense: "#8f99aa",
    tickReasoning: "#862e9c",
    tickReasoningDense: "#c996d6",
    reasoning: [174, 62, 201],
    answer: [47, 158, 68],
    prefill: "#9db4dd",
    culprit: "#e8590c",
    stall: [240, 62, 62],
    unattributed: [134, 142, 150],
    zebra: "#f6f8fb",
    life: "#d7dde6",
    axis: "#6b7482",
    grid: "#edf0f4",
    label: "#4a5260",
    highlight: "#1c7ed6",
    line: "#e3e7ee",
  };
  const TOP = 6;
  const AXIS_H = 24;
  const ROW_MIN = 3;
  const ROW_MAX = 16;
  const LABEL_MIN_ROW = 10;
  const MAX_FRAME_MS = 40;

  const S = {
    mode: "live",
    connected: false,
    paused: false,
    messages: 0,
    errors: [],
    nowUs: 0,
    nowAtMs: 0,
    windowUs: 30e6,
    zoom: "auto",
    staticView: null,
    zeroUs: null,
    backends: new Map(),
    hover: null,
    pinned: null,
    lastDrawMs: 0,
    draws: 0,
    lastFrameAt: 0,
    frozenToUs: null,
    source: null,
    wholeView: null,
    intervalUs: 0,
    title: "",
  };
  window.addEventListener("error", (e) => S.errors.push(String(e.message || e)));

  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const n = document.createElement(tag);
    if (cls) n.className = cls;
    if (text !== undefined) n.textContent = text;
    return n;
  };

  // -- data --------------------------------------------------------------------------

  function backendOf(msg) {
    const name = msg.backend.name;
    let b = S.backends.get(name);
    if (!b) {
      b = { name, provider: msg.backend.provider, streams: new Map(), stalls: new Map(),
            prefills: new Map(), untracked: 0, ui: null, rows: [], geo: null };
      S.backends.set(name, b);
    }
    return b;
  }

  function applyBackend(msg, snapshot) {
    const b = backendOf(msg);
    if (snapshot) {
      b.streams.clear();
      b.stalls.clear();
      b.prefills.clear();
    }
    b.untracked = msg.untracked || 0;
    for (const m of msg.streams) {
      let s = b.streams.get(m.id);
      if (!s) {
        s = { ticks: [], lo: 0, total: 0 };
        b.streams.set(m.id, s);
      }
      const known = s.total;
      Object.assign(s, m);
      const skip = Math.max(0, known - m.tick_index);
      for (let i = skip; i < m.ticks_us.length; i++) s.ticks.push(m.ticks_us[i]);
      s.total = Math.max(known, m.tick_index + m.ticks_us.length);
      delete s.ticks_us;
    }
    for (const st of msg.stalls) b.stalls.set(st.seq, st);
    for (const p of msg.prefills) b.prefills.set(p.request_id, p);
  }

  function apply(msg) {
    S.messages++;
    S.nowUs = msg.now_us;
    S.nowAtMs = performance.now();
    S.windowUs = msg.window_s * 1e6;
    S.intervalUs = (msg.interval_ms || 0) * 1000;
    const snapshot = msg.type === "snapshot";
    if (snapshot) {
      for (const b of S.backends.values()) {
        b.streams.clear(); b.stalls.clear(); b.prefills.clear();
      }
    }
    for (const bm of msg.backends) applyBackend(bm, snapshot);
    prune();
    fillZoom();
  }

  function prune() {
    if (S.mode !== "live") return;
    const cutoff = S.nowUs - S.windowUs;
    for (const b of S.backends.values()) {
      for (const [id, s] of b.streams) {
        if (s.end_us !== null && s.end_us < cutoff) { b.streams.delete(id); continue; }
        while (s.lo < s.ticks.length && s.ticks[s.lo] < cutoff) s.lo++;
        if (s.lo > 512 && s.lo * 2 > s.ticks.length) { s.ticks = s.ticks.slice(s.lo); s.lo = 0; }
      }
      for (const [k, st] of b.stalls) if (st.end_us < cutoff) b.stalls.delete(k);
      for (const [k, p] of b.prefills) if (p.first_token_us < cutoff) b.prefills.delete(k);
    }
  }

  // -- view --------------------------------------------------------------------------

  function view() {
    if (S.mode === "static") {
      const v = S.zoom === "closeup" && S.staticView ? S.staticView : S.wholeView;
      return { from: v.from_us, to: v.to_us };
    }
    let to = S.frozenToUs;
    if (to === null) {
      // One feed interval behind the newest message, moving on in real time: the
      // right edge scrolls smoothly and always has data up to it.
      const ahead = Math.min(Math.max((performance.now() - S.nowAtMs) * 1000, 0), 1.5 * S.intervalUs);
      to = S.nowUs - S.intervalUs + ahead;
    }
    let span = S.windowUs;
    if (S.zoom === "auto") {
      // From the oldest row kept (a little margin), at least 2 s, at most the window.
      let oldest = to;
      for (const b of S.backends.values()) {
        for (const s of b.streams.values()) oldest = Math.min(oldest, s.forwarded_us);
      }
      span = Math.min(S.windowUs, Math.max(2e6, (to - oldest) * 1.05));
    } else if (S.zoom !== "window") {
      span = Math.min(S.windowUs, Number(S.zoom));
    }
    return { from: to - span, to };
  }

  function fillZoom() {
    const sel = $("zoom");
    const want = S.mode === "static"
      ? (S.staticView ? [["closeup", "prefill close-up"], ["whole", "whole run"]]
        : [["whole", "whole run"]])
      : [["auto", "auto"], ["window", `last ${S.windowUs / 1e6} s`],
        ...[10e6, 5e6, 2e6].filter((v) => v < S.windowUs).map((v) => [String(v), `last ${v / 1e6} s`])];
    const key = want.map((w) => w[0] + w[1]).join("|");
    if (sel.dataset.key === key) return;
    sel.dataset.key = key;
    sel.replaceChildren(...want.map(([v, t]) => { const o = el("option", "", t); o.value = v; return o; }));
    sel.value = S.zoom;
  }

  function niceStep(spanUs, px) {
    const target = spanUs / Math.max(2, px / 110);
    const pow = 10 ** Math.floor(Math.log10(target));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * pow >= target) return m * pow;
    return 10 * pow;
  }

  function fmtSec(us, step) {
    const digits = step % 1e6 === 0 ? 0 : step % 1e5 === 0 ? 1 : step % 1e4 === 0 ? 2 : 3;
    return (us / 1e6).toFixed(digits);
  }

  const fmtMs = (ms) => (ms === null || ms === undefined ? "–" : ms >= 1000
    ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(ms < 10 ? 1 : 0)} ms`);

  // -- layout ------------------------------------------------------------------------

  function ensureUi(b) {
    if (b.ui) return b.ui;
    const section = el("section", "backend");
    const h2 = el("h2");
    const plot = el("div", "plot");
    const main = el("canvas", "main");
    const overlay = el("canvas", "overlay");
    plot.append(main, overlay);
    section.append(h2, plot);
    $("backends").append(section);
    overlay.addEventListener("mousemove", (e) => onMove(b, e));
    overlay.addEventListener("mouseleave", () => { S.hover = null; hideTip(); drawOverlays(); });
    overlay.addEventListener("click", (e) => onClick(b, e));
    b.ui = { section, h2, plot, main, overlay };
    return b.ui;
  }

  function culpritsOf(b) {
    const set = new Map();
    for (const p of b.prefills.values()) if (p.stalled_streams > 0) set.set(p.request_id, p);
    for (const st of b.stalls.values()) {
      for (const c of st.culprits) if (!set.has(c)) set.set(c, null);
    }
    return set;
  }

  function sizeCanvas(c, w, h) {
    const dpr = window.devicePixelRatio || 1;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
      c.style.width = `${w}px`;
      c.style.height = `${h}px`;
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  // -- drawing -----------------------------------------------------------------------

  function draw() {
    const t0 = performance.now();
    const v = view();
    const n = Math.max(1, S.backends.size);
    for (const b of S.backends.values()) drawBackend(b, v, n);
    const empty = $("empty");
    empty.hidden = S.backends.size > 0;
    empty.textContent = S.connected ? "no streams yet" : "waiting for data…";
    S.lastDrawMs = performance.now() - t0;
    S.draws++;
    drawOverlays();
    status();
    publish(v);
  }

  function lowerBound(a, lo, x) {
    let hi = a.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (a[mid] < x) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function drawBackend(b, v, nBackends) {
    const ui = ensureUi(b);
    const width = Math.max(480, ui.section.clientWidth || document.body.clientWidth - 32);
    const rows = [...b.streams.values()]
      .filter((s) => s.forwarded_us <= v.to && (s.end_us === null || s.end_us >= v.from))
      .sort((x, y) => x.forwarded_us - y.forwarded_us || (x.id < y.id ? -1 : 1));
    const avail = Math.max(240, (window.innerHeight - 150) / nBackends - 40);
    const rowH = Math.max(ROW_MIN, Math.min(ROW_MAX, Math.floor(avail / Math.max(rows.length, 1))));
    const gutter = rowH >= LABEL_MIN_ROW ? 170 : 120;
    const plotW = width - gutter - 28;
    const height = TOP + rows.length * rowH + AXIS_H;
    const culprits = culpritsOf(b);
    const x = (us) => gutter + ((us - v.from) / (v.to - v.from)) * plotW;
    const geo = { gutter, plotW, rowH, rows, x, v, width, height, index: new Map(), bands: [], bars: [],
                  phases: [] };
    rows.forEach((s, i) => geo.index.set(s.id, i));
    b.geo = geo;

    let stalls = 0, byCause = 0;
    for (const st of b.stalls.values()) { stalls++; if (st.cause === "prefill") byCause++; }
    ui.h2.replaceChildren(
      document.createTextNode(`backend ${b.name}`),
      el("small", "", `${b.provider} · ${rows.length} streams shown · ${stalls} stalls ` +
        `(${byCause} prefill, ${stalls - byCause} unattributed) · ${culprits.size} culprits` +
        (b.untracked ? ` · ${b.untracked} streams not tracked (limit)` : "")),
    );
    ui.plot.style.height = `${height}px`;
    const ctx = sizeCanvas(ui.main, width, height);
    sizeCanvas(ui.overlay, width, height);
    ctx.fillStyle = "#ffffff";  // opaque: what a screenshot or a pixel read sees
    ctx.fillRect(0, 0, width, height);

    // grid and axis
    const step = niceStep(v.to - v.from, plotW);
    const zero = S.mode === "live" ? v.to : (S.zeroUs ?? v.from);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const first = Math.ceil((v.from - zero) / step) * step + zero;
    for (let t = first; t <= v.to + 1; t += step) {
      const gx = Math.round(x(t)) + 0.5;
      ctx.fillStyle = C.grid;
      ctx.fillRect(gx, TOP, 1, rows.length * rowH);
      ctx.fillStyle = C.axis;
      const rel = t - zero;
      const label = S.mode === "live" ? (Math.abs(rel) < step / 2 ? "now" : `${fmtSec(rel, step)} s`)
        : `${fmtSec(rel, step)} s`;
      ctx.fillText(label, gx, TOP + rows.length * rowH + 6);
    }

    ctx.save();
    ctx.beginPath();
    ctx.rect(gutter, 0, plotW, height);
    ctx.clip();
    const live = S.mode === "live" ? v.to : null;
    rows.forEach((s, i) => {
      const y0 = TOP + i * rowH;
      if (rowH >= 6 && i % 2) { ctx.fillStyle = C.zebra; ctx.fillRect(gutter, y0, plotW, rowH); }
      const endUs = s.end_us ?? (live ?? s.ticks[s.ticks.length - 1] ?? s.forwarded_us);
      // lifetime
      const ly = y0 + Math.floor(rowH / 2);
      ctx.fillStyle = C.life;
      ctx.fillRect(x(s.forwarded_us), ly, Math.max(1, x(endUs) - x(s.forwarded_us)), 1);
      // prefill window
      const isCulprit = culprits.has(s.id);
      const pEnd = s.first_token_us ?? endUs;
      const bh = isCulprit ? Math.max(2, rowH - 2) : Math.max(1, Math.round(rowH * 0.5));
      const by = y0 + Math.floor((rowH - bh) / 2);
      const px0 = x(s.forwarded_us), px1 = Math.max(x(pEnd), px0 + 1);
      ctx.fillStyle = isCulprit ? C.culprit : C.prefill;
      ctx.fillRect(px0, by, px1 - px0, bh);
      geo.bars.push({ stream: s.id, culprit: isCulprit, x0: px0, x1: px1, y0: by, y1: by + bh });
      // a reasoning model's two phases: thinking (first reasoning to first answer event),
      // then the answer, each a light band under the ticks
      if (s.reasoning_us !== null && s.reasoning_us !== undefined) {
        const answerUs = s.answer_us ?? null;
        const rx0 = x(s.reasoning_us);
        const rx1 = Math.max(x(answerUs ?? endUs), rx0 + 1);
        const phase = { stream: s.id, open: s.end_us === null, y0, y1: y0 + rowH,
                        reasoning: { x0: rx0, x1: rx1 }, answer: null };
        ctx.fillStyle = `rgba(${C.reasoning.join(",")},0.22)`;
        ctx.fillRect(rx0, y0, rx1 - rx0, rowH);
        if (answerUs !== null && endUs > answerUs) {
          const ax0 = x(answerUs), ax1 = Math.max(x(endUs), ax0 + 1);
          ctx.fillStyle = `rgba(${C.answer.join(",")},0.22)`;
          ctx.fillRect(ax0, y0, ax1 - ax0, rowH);
          phase.answer = { x0: ax0, x1: ax1 };
        }
        geo.phases.push(phase);
      }
    });
    // ticks: runs of touching pixel columns become one rectangle; where ticks are
    // denser than the pixels they fade, so the gaps (and stalls) stand out
    const th = Math.max(2, rowH - (rowH >= 8 ? 4 : 1));
    const scale = plotW / (v.to - v.from);
    let inView = 0;
    const spans = rows.map((s) => {
      const k0 = lowerBound(s.ticks, s.lo, v.from);
      const k1 = lowerBound(s.ticks, k0, v.to + 1);
      inView += k1 - k0;
      return [k0, k1];
    });
    const dense = inView > 0.5 * rows.length * plotW;
    // A reasoning stream's ticks before its first answer event are reasoning: a path of
    // their own, in the reasoning colour.
    const cut = rows.map((s, i) => (s.reasoning_us === null || s.reasoning_us === undefined
      ? spans[i][0]
      : lowerBound(s.ticks, spans[i][0], s.answer_us ?? Infinity)));
    const tickPath = (part) => {
      ctx.beginPath();
      rows.forEach((s, i) => {
        const ty = TOP + i * rowH + Math.floor((rowH - th) / 2);
        const a = s.ticks;
        const k0 = part === "reasoning" ? spans[i][0] : Math.max(spans[i][0], cut[i]);
        const k1 = part === "reasoning" ? Math.min(spans[i][1], cut[i]) : spans[i][1];
        let runStart = -2, runEnd = -2;
        for (let k = k0; k < k1; k++) {
          const px = Math.floor(gutter + (a[k] - v.from) * scale);
          if (px <= runEnd + 1) { runEnd = Math.max(runEnd, px); continue; }
          if (runEnd >= 0) ctx.rect(runStart, ty, runEnd - runStart + 1, th);
          runStart = runEnd = px;
        }
        if (runEnd >= 0) ctx.rect(runStart, ty, runEnd - runStart + 1, th);
      });
      ctx.fill();
    };
    ctx.fillStyle = dense ? C.tickDense : C.tick;
    tickPath("answer");
    ctx.fillStyle = dense ? C.tickReasoningDense : C.tickReasoning;
    tickPath("reasoning");
    // stalls, over the ticks (a stall is a gap: only its two edge ticks are covered)
    for (const st of b.stalls.values()) {
      const i = geo.index.get(st.stream);
      if (i === undefined || st.end_us < v.from || st.start_us > v.to) continue;
      const y0 = TOP + i * rowH;
      const sx0 = x(st.start_us), sx1 = Math.max(x(st.end_us), sx0 + 2);
      const rgb = st.cause === "prefill" ? C.stall : C.unattributed;
      ctx.fillStyle = `rgba(${rgb[0]},${rgb[1]},${rgb[2]},0.38)`;
      ctx.fillRect(sx0, y0, sx1 - sx0, rowH);
      if (rowH >= 5) {
        ctx.strokeStyle = `rgba(${rgb[0]},${rgb[1]},${rgb[2]},0.95)`;
        ctx.lineWidth = 1;
        ctx.strokeRect(sx0 + 0.5, y0 + 0.5, sx1 - sx0 - 1, rowH - 1);
      }
      geo.bands.push({ seq: st.seq, stream: st.stream, cause: st.cause, culprits: st.culprits,
                       start_us: st.start_us, end_us: st.end_us,
                       x0: sx0, x1: sx1, y0, y1: y0 + rowH });
    }
    // culprit links: a dashed line at the culprit's first token across the rows it stalled
    for (const id of culprits.keys()) {
      const ci = geo.index.get(id);
      const s = ci === undefined ? null : rows[ci];
      if (!s || s.first_token_us === null) continue;
      let lo = ci, hi = ci;
      for (const bd of geo.bands) {
        if (!bd.culprits.includes(id)) continue;
        const ri = geo.index.get(bd.stream);
        lo = Math.min(lo, ri); hi = Math.max(hi, ri);
      }
      if (lo === hi) continue;
      const lx = Math.round(x(s.first_token_us)) + 0.5;
      ctx.strokeStyle = "rgba(232,89,12,0.55)";
      ctx.setLineDash([3, 3]);
      ctx.beginPath();
      ctx.moveTo(lx, TOP + lo * rowH);
      ctx.lineTo(lx, TOP + (hi + 1) * rowH);
      ctx.stroke();
      ctx.setLineDash([]);
    }
    ctx.restore();

    // gutter: labels and culprit marks
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    rows.forEach((s, i) => {
      const cy = TOP + i * rowH + rowH / 2;
      const isCulprit = culprits.has(s.id);
      if (isCulprit) {
        const p = culprits.get(s.id) || b.prefills.get(s.id);
        const n = p ? p.stalled_streams
          : new Set([...b.stalls.values()].filter((st) => st.culprits.includes(s.id)).map((st) => st.stream)).size;
        ctx.font = "600 11px system-ui, sans-serif";
        ctx.fillStyle = C.culprit;
        ctx.fillText(rowH >= LABEL_MIN_ROW ? trim(s.id, 22) : "culprit", gutter - 6, Math.max(cy, TOP + 6));
        // "culprit: N streams stalled" beside its prefill bar, on a white card
        const label = `culprit: ${n} stream${n === 1 ? "" : "s"} stalled`;
        const bx = Math.max(gutter, x(s.first_token_us ?? s.forwarded_us)) + 6;
        const tw = ctx.measureText(label).width;
        // right of the bar, or left of it when the bar ends near the right edge
        const left = Math.max(gutter + 4, x(s.forwarded_us) - tw - 9);
        const lx = bx + tw + 4 <= gutter + plotW ? bx : left;
        ctx.textAlign = "left";
        ctx.fillStyle = "rgba(255,255,255,0.9)";
        ctx.fillRect(lx - 3, cy - 7, tw + 6, 14);
        ctx.fillStyle = C.culprit;
        ctx.fillText(label, lx, cy);
        ctx.textAlign = "right";
        ctx.font = "11px system-ui, sans-serif";
      } else if (rowH >= LABEL_MIN_ROW) {
        ctx.fillStyle = C.label;
        ctx.fillText(trim(s.id, 24), gutter - 6, cy);
      }
    });
    ctx.fillStyle = C.line;
    ctx.fillRect(gutter - 1, TOP, 1, rows.length * rowH);
  }

  const trim = (t, n) => (t.length > n ? `${t.slice(0, n - 1)}…` : t);

  // -- hover, pin, tooltip -----------------------------------------------------------

  function hit(b, e) {
    const g = b.geo;
    if (!g) return null;
    const r = b.ui.overlay.getBoundingClientRect();
    const mx = e.clientX - r.left, my = e.clientY - r.top;
    const i = Math.floor((my - TOP) / g.rowH);
    if (i < 0 || i >= g.rows.length) return null;
    const s = g.rows[i];
    for (const bd of g.bands) {
      if (bd.stream === s.id && mx >= bd.x0 - 2 && mx <= bd.x1 + 2) return { b, kind: "stall", band: bd, stream: s };
    }
    return { b, kind: "stream", stream: s };
  }

  function onMove(b, e) {
    S.hover = hit(b, e);
    drawOverlays();
    if (S.hover) showTip(S.hover, e); else hideTip();
  }

  function onClick(b, e) {
    const h = hit(b, e);
    const id = h && h.kind === "stream" ? h.stream.id : null;
    S.pinned = id && culpritsOf(b).has(id) && (!S.pinned || S.pinned.id !== id) ? { b, id } : null;
    drawOverlays();
  }

  function drawOverlays() {
    for (const b of S.backends.values()) {
      if (!b.ui || !b.geo) continue;
      const g = b.geo;
      const ctx = sizeCanvas(b.ui.overlay, g.width, g.height);
      ctx.clearRect(0, 0, g.width, g.height);
      const focus = [];
      if (S.pinned && S.pinned.b === b) focus.push(S.pinned.id);
      const h = S.hover && S.hover.b === b ? S.hover : null;
      if (h && g.index.has(h.stream.id)) {
        const i = g.index.get(h.stream.id);
        ctx.strokeStyle = C.highlight;
        ctx.lineWidth = 1;
        ctx.strokeRect(g.gutter + 0.5, TOP + i * g.rowH + 0.5, g.plotW - 1, g.rowH - 1);
        if (h.kind === "stall") focus.push(...h.band.culprits);
        else focus.push(h.stream.id);
      }
      for (const id of focus) linkCulprit(ctx, g, id, h && h.kind === "stall" ? h.band : null);
    }
  }

  function linkCulprit(ctx, g, id, onlyBand) {
    const ci = g.index.get(id);
    if (ci === undefined) return;
    const s = g.rows[ci];
    const cx = g.x(s.first_token_us ?? s.forwarded_us);
    const cy = TOP + ci * g.rowH + g.rowH / 2;
    const bands = g.bands.filter((bd) => bd.culprits.includes(id) && (!onlyBand || bd === onlyBand));
    if (!bands.length) return;
    ctx.strokeStyle = "rgba(232,89,12,0.9)";
    ctx.lineWidth = 2;
    ctx.strokeRect(g.gutter + 0.5, TOP + ci * g.rowH - 0.5, g.plotW - 1, g.rowH + 1);
    ctx.lineWidth = 1;
    ctx.strokeStyle = "rgba(201,42,42,0.55)";
    ctx.beginPath();
    for (const bd of bands) {
      ctx.moveTo(cx, cy);
      ctx.lineTo(bd.x1, (bd.y0 + bd.y1) / 2);
    }
    ctx.stroke();
    ctx.strokeStyle = "#c92a2a";
    ctx.lineWidth = 1.5;
    for (const bd of bands) ctx.strokeRect(bd.x0, bd.y0, bd.x1 - bd.x0, bd.y1 - bd.y0);
  }

  function row(table, k, v, cls) {
    const tr = el("tr");
    tr.append(el("td", "", k), el("td", cls || "", v));
    table.append(tr);
  }

  function showTip(h, e) {
    const tip = $("tip");
    const s = h.stream;
    const t = el("table");
    let head;
    if (h.kind === "stall") {
      const bd = h.band;
      const st = h.b.stalls.get(bd.seq);
      head = el("b", "", `stall of ${s.id}`);
      row(t, "gap", fmtMs((bd.end_us - bd.start_us) / 1000));
      if (st) {
        row(t, "baseline", fmtMs(st.baseline_us / 1000));
        row(t, "threshold", fmtMs(st.threshold_us / 1000));
      }
      row(t, "cause", bd.cause === "prefill" ? "prefill of another request" : "unattributed");
      if (bd.culprits.length) row(t, "culprit", bd.culprits.join(", "), "culprit");
    } else {
      head = el("b", "", s.id);
      row(t, "model", s.model || "–");
      row(t, "prompt tokens", s.prompt_tokens === null ? "–"
        : (s.prompt_estimated ? `≈${s.prompt_tokens} (estimated)` : String(s.prompt_tokens)));
      if (s.ttft_ms !== null) row(t, "TTFT", fmtMs(s.ttft_ms));
      else row(t, "TTFT (upstream)", s.upstream_ttft_ms === null ? "waiting for first token" : fmtMs(s.upstream_ttft_ms));
      if (s.reasoning_us !== null && s.reasoning_us !== undefined) {
        const n = s.reasoning_tokens;
        row(t, "reasoning", `${fmtMs(s.reasoning_ms)}${n ? `, ${n} tokens` : ""}`, "reasoning");
        row(t, "first answer", s.answer_ttft_ms === null ? "none (only reasoned)" : fmtMs(s.answer_ttft_ms));
      }
      row(t, "worst gap", s.tokens > 1 ? fmtMs(s.worst_gap_ms) : "–");
      row(t, "tokens", String(s.tokens));
      row(t, "state", s.end_us === null ? "streaming" : `finished${s.outcome ? ` (${s.outcome})` : ""}`);
      if (s.stalls) row(t, "stalled", `${s.stalls} time${s.stalls > 1 ? "s" : ""}`);
      const culprits = culpritsOf(h.b);
      if (culprits.has(s.id)) {
        const p = culprits.get(s.id) || h.b.prefills.get(s.id);
        row(t, "culprit", p ? `stalled ${p.stalled_streams} streams, ${p.stalls} stalls, ` +
          `stutter cost ${p.stutter_cost_s.toFixed(2)} user-s` : "stalled other streams", "culprit");
      }
    }
    tip.replaceChildren(head, t);
    tip.hidden = false;
    const pad = 14;
    const w = tip.offsetWidth, hgt = tip.offsetHeight;
    tip.style.left = `${Math.min(e.clientX + pad, window.innerWidth - w - 4)}px`;
    tip.style.top = `${e.clientY + pad + hgt > window.innerHeight ? e.clientY - hgt - pad : e.clientY + pad}px`;
  }

  function hideTip() { $("tip").hidden = true; }

  // -- status, summary, test hook ----------------------------------------------------

  function status() {
    const st = $("status");
    if (S.mode === "static") { st.textContent = "recorded"; st.className = "status"; }
    else if (S.paused) { st.textContent = "paused"; st.className = "status paused"; }
    else if (S.connected) { st.textContent = "live"; st.className = "status live"; }
    else { st.textContent = S.messages ? "reconnecting…" : "connecting…"; st.className = "status down"; }
    let open = 0;
    for (const b of S.backends.values()) for (const s of b.streams.values()) if (s.end_us === null) open++;
    $("summary").textContent = S.mode === "live"
      ? `${open} open streams · last ${S.windowUs / 1e6} s kept` : S.title;
  }

  function publish(v) {
    const backends = [];
    for (const b of S.backends.values()) {
      const g = b.geo;
      const r = b.ui.main.getBoundingClientRect();
      backends.push({
        name: b.name,
        streams: b.streams.size,
        rows: g.rows.length,
        row_height: g.rowH,
        stalls: b.stalls.size,
        culprits: [...culpritsOf(b).keys()],
        canvas: { left: r.left + window.scrollX, top: r.top + window.scrollY, width: g.width, height: g.height },
        x: { from_us: v.from, to_us: v.to, left_px: g.gutter, width_px: g.plotW },
        bands: g.bands.slice(0, 2000),
        culprit_bars: g.bars.filter((bar) => bar.culprit),
        phases: g.phases.slice(0, 2000),
      });
    }
    window.__timelineState = {
      mode: S.mode, connected: S.connected, paused: S.paused, messages: S.messages,
      errors: S.errors.slice(), now_us: S.nowUs, view: { from_us: v.from, to_us: v.to },
      backends, last_draw_ms: S.lastDrawMs, draws: S.draws,
    };
  }

  // -- live loop ---------------------------------------------------------------------

  function connect() {
    const src = new EventSource("timeline/feed");
    S.source = src;
    src.onopen = () => { S.connected = true; status(); };
    src.onmessage = (ev) => {
      try { apply(JSON.parse(ev.data)); } catch (err) { S.errors.push(String(err)); throw err; }
      if (S.paused) return;
      S.connected = true;
    };
    src.onerror = () => { S.connected = false; status(); };
  }

  function frame(ts) {
    if (!S.paused && ts - S.lastFrameAt >= Math.max(MAX_FRAME_MS, S.lastDrawMs * 2)) {
      S.lastFrameAt = ts;
      draw();
    }
    requestAnimationFrame(frame);
  }

  function setPaused(p) {
    S.paused = p;
    $("pause").textContent = p ? "Resume" : "Pause";
    if (p) {
      S.frozenToUs = view().to;
      if (S.source) { S.source.close(); S.source = null; }
      S.connected = false;
    } else {
      S.frozenToUs = null;
      connect();
    }
    draw();
  }

  function start() {
    const embedded = $("timeline-data");
    $("zoom").addEventListener("change", (e) => { S.zoom = e.target.value; draw(); });
    window.addEventListener("resize", () => draw());
    if (embedded) {
      const data = JSON.parse(embedded.textContent);
      S.mode = "static";
      apply(data);
      S.staticView = data.view || null;
      S.zeroUs = data.zero_us ?? null;
      let lo = Infinity, hi = -Infinity;
      for (const b of S.backends.values()) for (const s of b.streams.values()) {
        lo = Math.min(lo, s.forwarded_us);
        hi = Math.max(hi, s.end_us ?? s.ticks[s.ticks.length - 1] ?? s.forwarded_us);
      }
      S.wholeView = { from_us: lo, to_us: Math.max(hi, lo + 1) };
      S.zoom = S.staticView ? "closeup" : "whole";
      $("pause").hidden = true;
      S.title = [data.title, data.subtitle].filter(Boolean).join(" · ");
      if (data.title) document.title = `tokenstamp timeline: ${data.title}`;
      fillZoom();
      draw();
      return;
    }
    $("pause").addEventListener("click", () => setPaused(!S.paused));
    document.addEventListener("keydown", (e) => {
      if (e.code === "Space" && e.target === document.body) { e.preventDefault(); setPaused(!S.paused); }
    });
    fillZoom();
    connect();
    requestAnimationFrame(frame);
  }

  start();
})();
