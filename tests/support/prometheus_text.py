"""Reading the server's /metrics answer (the Prometheus text format) in tests."""

from __future__ import annotations


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0
