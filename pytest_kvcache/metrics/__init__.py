"""The plugin's metrics: the catalogue that declares each one (:mod:`.catalogue`), and the Prometheus
``/metrics`` scrapes of a server with the values and deltas read from them (:mod:`.prometheus`).

``from pytest_kvcache.metrics import parse, Scrape, engine_delta, …`` keeps working: the scrape helpers are
re-exported here.
"""

from __future__ import annotations

from pytest_kvcache.metrics import catalogue as catalogue
from pytest_kvcache.metrics.prometheus import Scrape as Scrape
from pytest_kvcache.metrics.prometheus import delta as delta
from pytest_kvcache.metrics.prometheus import engine_delta as engine_delta
from pytest_kvcache.metrics.prometheus import parse as parse
from pytest_kvcache.metrics.prometheus import spec_metrics as spec_metrics

__all__ = [
    "Scrape",
    "catalogue",
    "delta",
    "engine_delta",
    "parse",
    "spec_metrics",
]
