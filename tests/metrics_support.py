"""Reading a ``/metrics`` answer in the tests (in-process and on real processes alike), with
prometheus_client's own parser: what a Prometheus server would see, not a regex's idea of it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: each sample's value by its name and its labels
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples_of(r: httpx.Response) -> Samples:
    """The samples of a ``/metrics`` answer, which must be a 200 in the text format."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)
