"""Reading a ``/metrics`` page (tokenstamp's or a server's own) into numbers to compare."""

from __future__ import annotations

import math
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Samples:
    """Every sample of one scrape: ``(name, sorted labels) -> value``."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    """The samples."""

    def sum(self, name: str, **labels: str) -> float:
        """Sum of the samples named ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, lab), v in self.values.items() if n == name and want <= set(lab))

    def buckets(self, family: str, **labels: str) -> dict[float, float]:
        """Cumulative bucket counts of a histogram by upper bound, summed over other labels."""
        out: dict[float, float] = {}
        want = set(labels.items())
        for (n, lab), v in self.values.items():
            if n != family + "_bucket" or not want <= set(lab):
                continue
            le = float(dict(lab)["le"])
            out[le] = out.get(le, 0.0) + v
        return dict(sorted(out.items()))

    def minus(self, before: Samples) -> Samples:
        """The increase since ``before`` (counters and histograms)."""
        return Samples({k: v - before.values.get(k, 0.0) for k, v in self.values.items()})


async def scrape(url: str) -> Samples:
    """GET ``url`` (a ``/metrics`` page) and parse it."""
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        r.raise_for_status()
        text = await r.text()
    values = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Samples(values)


def common_bounds(a: dict[float, float], b: dict[float, float]) -> list[float]:
    """Bucket bounds both histograms have (``+Inf`` included)."""
    return sorted(le for le in a if le in b or (math.isinf(le) and any(math.isinf(x) for x in b)))
