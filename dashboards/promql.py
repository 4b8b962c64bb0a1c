"""Small PromQL builders shared by the dashboards and the rules.

Plain string building, nothing clever: every function returns one PromQL
expression. Metric names always come from an ``exporters.names.Instrument``.

Histograms are read in both encodings Prometheus may hold: native (one series
``name{...}`` per label set, scraped with ``--enable-feature=native-histograms``
or written from OTLP exponential histograms) and classic (``name_bucket{le}``,
``name_sum``, ``name_count``). Each reader asks for the native form first and
falls back to the classic one per group, with ``or``: the count and sum as
``histogram_count(native) or classic``; a percentile as
``histogram_quantile(q, native or ignoring (le) classic)``, because Prometheus
(2.42 at least) returns nothing for a group that hands it both a native
histogram and classic buckets, and ``ignoring (le)`` drops the buckets of every
group that has a native histogram; a share above a bound as
``1 - histogram_fraction(-Inf, bound, native)`` or the classic estimate. All of
them exist in Prometheus 2.40 and later. A group keeps to one encoding at each
evaluation, never a sum of both (a native and a classic replica of one
backend, during a switch-over, count as the native one alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from exporters import names

#: Grafana's rate window that adapts to the scrape interval and the zoom.
RATE_INTERVAL = "$__rate_interval"
#: The ``tokenstamp_tenant`` label: present only when the proxy runs with ``--tenant-header``.
TENANT = names.label_name(names.TENANT)
#: Matcher of the dashboards' ``$tenant`` variable. Its "All" is ``.*``, which also
#: matches series without the label (an absent label matches as the empty string),
#: so every panel works with and without tenants.
TENANT_MATCHER = f'{TENANT}=~"$tenant"'
#: What a panel grouped by tenant shows where the series carry no tenant.
NO_TENANT = "all (no --tenant-header)"


def num(x: float) -> str:
    """A float as PromQL and Prometheus print it: ``2`` not ``2.0``, ``0.1`` as is."""
    return str(int(x)) if float(x).is_integer() else format(x, ".6g")


def le_matcher(bound: float) -> str:
    """Matcher for the bucket ``le=bound``, robust to both exposition formats.

    prometheus_client writes whole bounds as ``1.0``, an OTLP pipeline (and
    Go) as ``1``; Prometheus 3 normalises to ``1.0`` on ingestion. A regex
    accepts either; fractional bounds print the same everywhere.
    """
    if float(bound).is_integer():
        return f'le=~"{int(bound)}(\\\\.0)?"'
    return f'le="{num(bound)}"'


def matchers(*parts: str) -> str:
    """``{a, b}`` from non-empty matcher strings (empty braces are omitted)."""
    kept = [p for p in parts if p]
    return "{" + ", ".join(kept) + "}" if kept else ""


def by(labels: Sequence[str]) -> str:
    """``by (a, b)`` clause; empty when there is nothing to group by."""
    return f" by ({', '.join(labels)})" if labels else ""


def sum_rate(series: str, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """``sum by (labels) (rate(series{sel}[window]))``."""
    return f"sum{by(labels)} (rate({series}{sel}[{window}]))"


def counter_rate(inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """Summed per-second rate of a counter instrument."""
    if inst.kind is not names.Kind.COUNTER:
        raise ValueError(f"{inst.name} is not a counter")
    return sum_rate(inst.prom_series, sel, window, labels)


def _histogram(inst: names.Instrument) -> None:
    if inst.kind is not names.Kind.HISTOGRAM:
        raise ValueError(f"{inst.name} is not a histogram")


def hist_rate(
    inst: names.Instrument, part: str, sel: str, window: str, labels: Sequence[str] = ()
) -> str:
    """Summed rate of a histogram's classic ``_sum``, ``_count`` or ``_bucket`` series."""
    _histogram(inst)
    if part not in ("sum", "count", "bucket"):
        raise ValueError(f"{inst.name}: no _{part} series")
    return sum_rate(f"{inst.prom_name}_{part}", sel, window, labels)


def native_rate(inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """Summed rate of a histogram's native series (a native histogram per group)."""
    _histogram(inst)
    return sum_rate(inst.prom_name, sel, window, labels)


def _either(native: str, classic: str, matching: str = "") -> str:
    """``native or classic``, each on its own lines, in parentheses."""
    return f"(\n  {_indent(native)}\nor{matching}\n  {_indent(classic)}\n)"


def count_rate(inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """Observations per second of a histogram, native or classic."""
    native = f"histogram_count({native_rate(inst, sel, window, labels)})"
    return _either(native, hist_rate(inst, "count", sel, window, labels))


def sum_of_rate(inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """Per-second sum of a histogram's observations (seconds per second, tokens per
    second...), native or classic."""
    native = f"histogram_sum({native_rate(inst, sel, window, labels)})"
    return _either(native, hist_rate(inst, "sum", sel, window, labels))


def quantile(
    q: float, inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()
) -> str:
    """``histogram_quantile`` of a histogram instrument, per ``labels``, native or classic."""
    native = native_rate(inst, sel, window, labels)
    classic = hist_rate(inst, "bucket", sel, window, ("le", *labels))
    return f"histogram_quantile({num(q)}, {_either(native, classic, ' ignoring (le)')})"


def buckets_increase(inst: names.Instrument, sel: str, window: str) -> str:
    """What each bucket gained over ``window`` (a heatmap): the native histogram, else the
    classic buckets by ``le``."""
    _histogram(inst)
    native = f"sum(increase({inst.prom_name}{sel}[{window}]))"
    classic = f"sum by (le) (increase({inst.prom_name}_bucket{sel}[{window}]))"
    return f"{native}\nor ignoring (le)\n{classic}"


def mean(inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """Mean observation of a histogram: rate of its sum over rate of its count."""
    return f"{sum_of_rate(inst, sel, window, labels)}\n/\n{count_rate(inst, sel, window, labels)}"


def ratio(part: str, whole: str) -> str:
    """``part / whole`` that is 0, not absent, where ``part`` has no series for a group.

    A counter series appears only when first incremented: a tenant none of whose
    streams ever missed has no ``missed`` series, and its error ratio would vanish.
    """
    return f"(\n  {_indent(part)}\nor\n  0 * {_indent(whole)}\n)\n/\n{whole}"


def fill_empty(expr: str, label: str, value: str) -> str:
    """``expr`` with ``label`` set to ``value`` on every series where it is empty or absent."""
    return f'label_replace(\n  {_indent(expr)},\n  "{label}", "{value}", "{label}", ""\n)'


def by_tenant(expr: str, label: str = TENANT) -> str:
    """``expr`` grouped by a tenant label, with ``NO_TENANT`` where the series carry none."""
    return fill_empty(expr, label, NO_TENANT)


def _with(sel: str, extra: str) -> str:
    """Add one matcher to a ``{...}`` selector string."""
    return matchers(sel.strip("{}"), extra)


def rate_le(
    inst: names.Instrument, bound: float, sel: str, window: str, labels: Sequence[str] = ()
) -> str:
    """Per-second rate of observations ``<= bound``.

    Exact when ``bound`` is a bucket boundary. Otherwise estimated by linear
    interpolation inside the bucket that contains it, the assumption
    ``histogram_quantile`` makes too; add the bound to the instrument's
    buckets to make it exact.
    """
    buckets = inst.buckets
    if not 0 < bound <= buckets[-1]:
        raise ValueError(f"{inst.name}: {bound} is outside the buckets")

    def bucket(b: float) -> str:
        return hist_rate(inst, "bucket", _with(sel, le_matcher(b)), window, labels)

    if bound in buckets:
        return bucket(bound)
    hi = next(b for b in buckets if b > bound)
    lower = [b for b in buckets if b < bound]
    if not lower:
        # Below the first boundary: the lowest bucket starts at 0.
        return f"{bucket(hi)} * {num(bound / hi)}"
    lo = lower[-1]
    frac = (bound - lo) / (hi - lo)
    return f"(\n  {bucket(lo)} * {num(1 - frac)}\n  + {bucket(hi)} * {num(frac)}\n)"


def share_above(
    inst: names.Instrument, bound: float, sel: str, window: str, labels: Sequence[str] = ()
) -> str:
    """Share of a histogram's observations above ``bound``, native or classic.

    Native: ``1 - histogram_fraction(-Inf, bound, ...)``, interpolated inside the one
    exponential bucket that holds ``bound`` (at most a few percent wide). Classic:
    ``1 - le(bound) / count`` (``rate_le``: exact on a bucket boundary).
    """
    native = f"1 - histogram_fraction(-Inf, {num(bound)}, {native_rate(inst, sel, window, labels)})"
    good = rate_le(inst, bound, sel, window, labels)
    total = hist_rate(inst, "count", sel, window, labels)
    classic = f"1 - (\n  {_indent(good)}\n/\n  {total}\n)"
    return _either(native, classic)


def _indent(expr: str) -> str:
    return expr.replace("\n", "\n  ")
