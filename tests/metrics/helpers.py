"""Parse a Prometheus text exposition into ``{(name, labels): value}`` for the assertions."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of ``text``, keyed by its name and its labels (as a frozenset of pairs)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    """The sample ``name{labels}``; KeyError naming it when it is missing."""
    key = (name, frozenset(labels.items()))
    if key not in found:
        raise KeyError(f"no sample {name}{labels}")
    return found[key]
