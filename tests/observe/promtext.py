"""Reading Prometheus text the way a scraper does (prometheus_client's parser)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One scrape's samples; ``value(name, **labels)`` sums the samples whose labels include those."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        found = [s.value for s in self.samples
                 if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found)

    def labelsets(self, name: str) -> list[dict[str, str]]:
        return [s.labels for s in self.samples if s.name == name]
