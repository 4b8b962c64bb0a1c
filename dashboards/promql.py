"""Small PromQL builders shared by the dashboards and the rules.

Plain string building, nothing clever: every function returns one PromQL
expression. Metric names always come from an ``exporters.names.Instrument``.
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


def hist_rate(
    inst: names.Instrument, part: str, sel: str, window: str, labels: Sequence[str] = ()
) -> str:
    """Summed rate of a histogram's ``_sum``, ``_count`` or ``_bucket`` series."""
    if inst.kind is not names.Kind.HISTOGRAM or part not in ("sum", "count", "bucket"):
        raise ValueError(f"{inst.name}: no _{part} series")
    return sum_rate(f"{inst.prom_name}_{part}", sel, window, labels)


def quantile(
    q: float, inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()
) -> str:
    """``histogram_quantile`` of a histogram instrument, per ``labels``."""
    buckets = hist_rate(inst, "bucket", sel, window, ("le", *labels))
    return f"histogram_quantile({num(q)}, {buckets})"


def mean(inst: names.Instrument, sel: str, window: str, labels: Sequence[str] = ()) -> str:
    """Mean observation of a histogram: rate of ``_sum`` over rate of ``_count``."""
    s = hist_rate(inst, "sum", sel, window, labels)
    c = hist_rate(inst, "count", sel, window, labels)
    return f"{s}\n/\n{c}"


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
    """Share of a histogram's observations above ``bound``: ``1 - le(bound) / count``."""
    good = rate_le(inst, bound, sel, window, labels)
    total = hist_rate(inst, "count", sel, window, labels)
    return f"1 - (\n  {_indent(good)}\n/\n  {total}\n)"


def _indent(expr: str) -> str:
    return expr.replace("\n", "\n  ")
