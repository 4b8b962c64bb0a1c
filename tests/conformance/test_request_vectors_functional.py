"""Client request vectors (``vectors.py``) through tokenstamp, aiohttp's server and nginx.

Every vector goes once through every target, each time over a fresh raw
connection (``rawhttp.send_raw``), in front of a recording upstream that
answers each request it reads with 200 and a body naming it. The module
collects all of that once (the ``collected`` fixture), then holds, per vector:

- tokenstamp answers with the status codes aiohttp's server answers (and with
  the vector's ``pinned`` codes, where it has them);
- nothing is smuggled through tokenstamp: the upstream received exactly the
  requests whose answers the client got, each as the client framed it (method
  and body), so a request the proxy refused never reached it;
- where tokenstamp and nginx differ, the difference is a row of the table in
  ``docs/http-conformance.md`` ("Client requests"), and every row is one;
- tokenstamp logs no traceback.

``python -m tests.conformance.test_request_vectors_functional`` prints what
every target answered to every vector.

How the vectors run at once and stay apart: each target runs as ``LANES``
instances, each in front of its own upstream port, and each lane sends its
vectors one after the other, so what a lane's upstream received while a vector
ran is that vector's. A ``ContextVar`` set before a lane starts its servers is
seen by every callback and task of those servers, so a log record says which
lane, and so which vector, it came from.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from tests.conformance.rawhttp import send_raw
from tests.conformance.targets import ROOT, nginx_available, start_targets
from tests.conformance.vectors import BY_NAME, VECTORS, Framed, Vector

TARGETS = ("tokenstamp", "aiohttp", "nginx")
LANES = 6
"""Instances per target, each sending its share of the vectors one at a time."""
IDLE_S = 0.5
"""Silence after which the client stops reading a connection the server keeps open."""
OVERRIDES = {"header_timeout_s": 2.0, "body_timeout_s": 1.0, "read_timeout_s": 5.0}
"""tokenstamp's and aiohttp's timeouts: a short body gets its 408 within ``BODY_WAIT_S``."""
SEQ = "X-Upstream-Seq"
"""The header naming the upstream request a response answers."""
DOC = ROOT / "docs" / "http-conformance.md"
SECTION = "## Client requests"


@dataclass(frozen=True, slots=True)
class Record:
    """One request as the recording upstream received it."""

    seq: str
    """Its name, sent back in ``X-Upstream-Seq``."""
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    """Its body, the chunked coding removed."""
    complete: bool
    """It arrived whole (not cut off in its head or body by the target going away)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one vector did through one target."""

    statuses: tuple[int, ...]
    """Every status the client received, interim ones included."""
    answered: tuple[str, ...]
    """``X-Upstream-Seq`` of each response the client got that the upstream made."""
    upstream: tuple[Record, ...]
    """What the upstream received meanwhile."""
    closed: bool
    """The target closed the connection (else the client gave up)."""
    tracebacks: tuple[str, ...] = ()
    """Log records with a traceback from ``asyncio`` or ``tokenstamp.*`` meanwhile."""


@dataclass
class Collected:
    """Every vector through every target."""

    outcomes: dict[str, dict[str, Outcome]]
    """vector name -> target name -> outcome."""
    stray_tracebacks: list[str]
    """Tracebacks logged outside any target's servers (no lane to blame)."""


@dataclass
class Lane:
    """One instance of a target with its own upstream port; sends one vector at a time."""

    target: str
    index: int
    records: list[Record] = field(default_factory=list)
    """Every request its upstream received."""
    current: str = ""
    """The vector being sent (or the last one)."""
    connections: set[asyncio.BaseTransport] = field(default_factory=set)
    """The upstream's open connections."""

    @property
    def name(self) -> str:
        return f"{self.target}{self.index}"


_lane: contextvars.ContextVar[Lane | None] = contextvars.ContextVar("lane", default=None)


class _Tracebacks(logging.Handler):
    """Collects the records that carry a traceback, by the lane and vector they came from."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: dict[tuple[str, str], list[str]] = defaultdict(list)
        """(target, vector) -> formatted records; ("", "") when no lane is known."""

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[0] if record.exc_info else None
        if exc is None and not record.stack_info and "Traceback" not in record.getMessage():
            return
        text = self.format(record)
        lane = _lane.get()
        key = (lane.target, lane.current) if lane is not None else ("", "")
        self.found[key].append(f"{record.name}: {text}")


def _dechunk(data: bytearray, pos: int) -> tuple[bytes, int] | None:
    """A chunked body from ``pos`` (RFC 9112 7.1): the body and where it ends; ``None``
    while it is incomplete."""
    body = bytearray()
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(data[pos:eol].split(b";", 1)[0].strip() or b"0", 16)
        pos = eol + 2
        if size == 0:
            while True:  # the trailer section, to its empty line
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    return None
                if eol == pos:
                    return bytes(body), eol + 2
                pos = eol + 2
        if len(data) < pos + size + 2:
            return None
        body += data[pos : pos + size]
        pos += size + 2


class _Recorder(asyncio.Protocol):
    """The recording upstream, one connection: records each request, answers it 200 with a
    body naming it.

    Not aiohttp's server, nor llhttp: both refuse what a proxy may well forward (a
    second Content-Type, a method they do not know, a raw UTF-8 target), and the
    refusal would hide that it was forwarded. This reads any request line and
    fields and frames the body as the targets write it (``Transfer-Encoding:
    chunked`` or ``Content-Length``, RFC 9112 6.3); it refuses nothing.
    """

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.lane.connections.add(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lane.connections.discard(self.transport)  # type: ignore[arg-type]
        if self.buf.strip():
            self._record(bytes(self.buf), b"", complete=False)
            self.buf.clear()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while self.transport is not None and not self.transport.is_closing():
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[: end + 4])
            lines = head.split(b"\r\n")
            values = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                values[name.strip().lower()] = value.strip().lower()
            if b"chunked" in values.get(b"transfer-encoding", b""):
                found = _dechunk(buf, end + 4)
                if found is None:
                    return
                body, stop = found
            else:
                stop = end + 4 + int(values.get(b"content-length") or b"0")
                if len(buf) < stop:
                    return
                body = bytes(buf[end + 4 : stop])
            del buf[:stop]
            record = self._record(head, body, complete=True)
            close = values.get(b"connection") == b"close" or lines[0].endswith(b"HTTP/1.0")
            text = f"upstream {record.seq}: {record.method} {record.target} ({len(body)} bytes)\n"
            self.transport.write(
                (
                    f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {len(text)}\r\n{SEQ}: {record.seq}\r\n"
                    + ("Connection: close\r\n" if close else "")
                    + "\r\n"
                    + text
                ).encode("latin-1")
            )
            if close:
                self.transport.close()

    def _record(self, head: bytes, body: bytes, *, complete: bool) -> Record:
        lines = head.split(b"\r\n")
        method, _, rest = lines[0].partition(b" ")
        target = rest.rpartition(b" ")[0] or rest
        fields = [line.partition(b":") for line in lines[1:] if line]
        record = Record(
            f"{self.lane.name}-{len(self.lane.records)}",
            method.decode("latin-1"),
            target.decode("latin-1"),
            tuple((k.decode("latin-1"), v.strip().decode("latin-1")) for k, _, v in fields),
            body,
            complete,
        )
        self.lane.records.append(record)
        return record


async def _run_lane(lane: Lane, queue: asyncio.Queue[Vector], out: dict) -> None:
    _lane.set(lane)  # seen by every server started below, their callbacks and their tasks
    loop = asyncio.get_running_loop()
    upstream = await loop.create_server(lambda: _Recorder(lane), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{upstream.sockets[0].getsockname()[1]}"
        overrides = OVERRIDES if lane.target != "nginx" else {}
        targets = await start_targets(url, (lane.target,), **overrides)
        try:
            port = targets[lane.target].port
            while not queue.empty():
                vector = queue.get_nowait()
                lane.current = vector.name
                out[vector.name][lane.target] = await _send(lane, port, vector)
        finally:
            await targets.close()
    finally:
        upstream.close()
        for transport in list(lane.connections):
            transport.close()
        await upstream.wait_closed()


async def _send(lane: Lane, port: int, vector: Vector) -> Outcome:
    first = len(lane.records)
    idle_s = vector.idle_s or IDLE_S
    got = await send_raw(
        port, vector.pieces, idle_s=idle_s, total_s=idle_s + 5.0, pause_s=vector.pause_s
    )
    await asyncio.sleep(0.05)  # anything the target still sends upstream arrives meanwhile
    return Outcome(
        statuses=tuple(got.statuses),
        answered=tuple(v.decode("latin-1") for r in got.final for v in r.header(SEQ)),
        upstream=tuple(lane.records[first:]),
        closed=got.closed,
    )


async def collect(targets: tuple[str, ...] = TARGETS, lanes: int = LANES) -> Collected:
    """Send every vector through every target (``lanes`` instances of each at once)."""
    out: dict[str, dict[str, Outcome]] = defaultdict(dict)
    catcher = _Tracebacks()
    watched = [logging.getLogger("asyncio"), logging.getLogger("tokenstamp")]
    for logger in watched:
        logger.addHandler(catcher)
    try:
        runs = []
        for name in targets:
            queue: asyncio.Queue[Vector] = asyncio.Queue()
            for v in sorted(VECTORS, key=lambda v: -v.idle_s):  # the slow ones first
                queue.put_nowait(v)
            runs += [_run_lane(Lane(name, i), queue, out) for i in range(lanes)]
        await asyncio.gather(*runs)
    finally:
        for logger in watched:
            logger.removeHandler(catcher)
    stray = []
    for (target, vector), texts in catcher.found.items():
        if target in out.get(vector, {}):
            o = out[vector][target]
            out[vector][target] = dataclasses.replace(o, tracebacks=(*o.tracebacks, *texts))
        else:
            stray += texts
    return Collected(dict(out), stray)


def codes(outcome: Outcome) -> str:
    """Statuses as the documentation writes them: ``200``, ``100 200``; ``-`` for none."""
    return " ".join(map(str, outcome.statuses)) or "-"


def format_table(collected: Collected) -> str:
    """One line per vector: each target's codes, ``x`` if it closed, ``uN``: N upstream."""
    targets = sorted({t for row in collected.outcomes.values() for t in row}, key=TARGETS.index)
    lines = [f"{'vector':34}" + "".join(f"{t:>18}" for t in targets)]
    for v in VECTORS:
        row = collected.outcomes[v.name]
        cells = [
            f"{codes(o) + ('x' if o.closed else ' ') + f' u{len(o.upstream)}':>18}"
            for o in (row[t] for t in targets)
        ]
        lines.append(f"{v.name:34}" + "".join(cells))
    return "\n".join(lines)


# The tests

# Every test reads the table collected once per module: a rerun would read the same table.
pytestmark = pytest.mark.flaky(reruns=0)


@pytest.fixture(scope="module")
def collected() -> Collected:
    """Every vector through every target (nginx where installed), collected once."""
    return asyncio.run(collect(TARGETS if nginx_available() else TARGETS[:2]))


NAMES = [v.name for v in VECTORS]


@pytest.mark.parametrize("name", NAMES)
def test_tokenstamp_answers_as_aiohttp(
    collected: Collected, documented_aiohttp: dict[str, tuple[str, str, str]], name: str
) -> None:
    """The status codes aiohttp's server gives the same bytes, interim ones included,
    except where the page's aiohttp table says otherwise and why."""
    row = collected.outcomes[name]
    ours, theirs = codes(row["tokenstamp"]), codes(row["aiohttp"])
    doc = documented_aiohttp.get(name)
    if doc is None:
        assert ours == theirs, f"{name}: tokenstamp answered {ours}, aiohttp {theirs}"
    else:
        assert ours != theirs, f"{name}: documented as a difference, but both answer {ours}"
        assert doc[:2] == (ours, theirs), (
            f"{name}: tokenstamp answers {ours}, aiohttp {theirs}; the page says {doc[:2]}"
        )
    pinned = BY_NAME[name].pinned
    if pinned is not None:
        for target in ("tokenstamp", "aiohttp"):
            assert row[target].statuses == pinned, (
                f"{name}: {target} answered {codes(row[target])}, must answer {pinned}"
            )


def _subsequence(got: list[Framed], allowed: tuple[Framed, ...]) -> bool:
    rest = iter(allowed)
    return all(any(g == a for a in rest) for g in got)


@pytest.mark.parametrize("name", NAMES)
def test_nothing_smuggled_through_tokenstamp(collected: Collected, name: str) -> None:
    """The upstream received the requests whose answers the client got, as the client
    framed them; nothing the proxy refused, nothing the client did not frame."""
    o = collected.outcomes[name]["tokenstamp"]
    framed = BY_NAME[name].requests
    assert all(r.complete for r in o.upstream), f"{name}: the upstream got a cut-off request"
    got = [Framed(r.method, r.body) for r in o.upstream]
    assert _subsequence(got, framed), (
        f"{name}: the upstream received {got}; the client framed {framed}"
    )
    received = sorted(r.seq for r in o.upstream)
    assert sorted(o.answered) == received, (
        f"{name}: the upstream received {received}, the client got the answers to "
        f"{sorted(o.answered)} (statuses {codes(o)})"
    )


def documented_differences(reference: str = "nginx") -> dict[str, tuple[str, str, str]]:
    """The table of the "Client requests" section whose third column is ``reference``:
    vector -> (tokenstamp, reference, why)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    rows = {}
    table = ""
    for line in text[start : end if end >= 0 else None].splitlines():
        if not line.startswith("|"):
            table = ""
            continue
        cells = [c.strip().strip("`").strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Vector":
            table = cells[2] if len(cells) == 4 else ""
            continue
        if len(cells) != 4 or re.fullmatch(r":?-+:?", cells[0]) or table != reference:
            continue
        rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


@pytest.fixture(scope="module")
def documented() -> dict[str, tuple[str, str, str]]:
    return documented_differences("nginx")


@pytest.fixture(scope="module")
def documented_aiohttp() -> dict[str, tuple[str, str, str]]:
    return documented_differences("aiohttp")


def test_documented_rows_are_vectors(
    documented: dict[str, tuple[str, str, str]],
    documented_aiohttp: dict[str, tuple[str, str, str]],
) -> None:
    """Every row of both tables names a vector and gives a reason."""
    for table in (documented, documented_aiohttp):
        assert table, f"a table is missing in the {SECTION!r} section of {DOC}"
        assert set(table) <= set(BY_NAME), f"not vectors: {set(table) - set(BY_NAME)}"
        assert all(why for _, _, why in table.values())


@pytest.mark.parametrize("name", NAMES)
def test_nginx_differences_documented(
    collected: Collected, documented: dict[str, tuple[str, str, str]], name: str
) -> None:
    """Where tokenstamp and nginx answer differently, the page says so, and only there."""
    row = collected.outcomes[name]
    if "nginx" not in row:
        pytest.skip("nginx is not installed (Debian: nginx-light): nothing to compare with")
    ours, nginx = codes(row["tokenstamp"]), codes(row["nginx"])
    doc = documented.get(name)
    if ours == nginx:
        assert doc is None, f"{name}: documented as a difference, but both answer {ours}"
    else:
        assert doc is not None, f"{name}: tokenstamp answers {ours}, nginx {nginx}: not documented"
        assert doc[:2] == (ours, nginx), (
            f"{name}: tokenstamp answers {ours}, nginx {nginx}; the page says {doc[:2]}"
        )


@pytest.mark.parametrize("name", NAMES)
def test_no_traceback_logged(collected: Collected, name: str) -> None:
    """tokenstamp logs no traceback, whatever a client sends."""
    found = collected.outcomes[name]["tokenstamp"].tracebacks
    assert not found, f"{name}: tokenstamp logged:\n" + "\n".join(found)


def test_no_stray_traceback(collected: Collected) -> None:
    """No traceback was logged where no lane can be blamed (a task garbage-collected)."""
    assert not collected.stray_tracebacks, "\n".join(collected.stray_tracebacks)


if __name__ == "__main__":
    started = time.monotonic()
    result = asyncio.run(collect(TARGETS if nginx_available() else TARGETS[:2]))
    print(format_table(result))
    for vname, by_target in result.outcomes.items():
        for target, o in by_target.items():
            for tb in o.tracebacks:
                print(f"\n{vname} through {target} logged {tb}")
    for tb in result.stray_tracebacks:
        print(f"\nlogged outside any lane: {tb}")
    print(f"\n{time.monotonic() - started:.1f} s")
