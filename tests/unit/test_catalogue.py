"""The metric catalogue (``metrics.catalogue``): a new metric is one entry, and every reader — the probe
registry, statistics, bands, the report's tables, terminal and plots — follows it; the stock entries agree
with what the client measures and with the committed noise bands."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from pytest_kvcache import stats
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.metrics.catalogue import Metric
from pytest_kvcache.model.records import Record
from pytest_kvcache.probes import registry
from pytest_kvcache.probes.registry import ProbeSpec
from pytest_kvcache.report import bands
from pytest_kvcache.report.build import build
from pytest_kvcache.report.load import RunData
from pytest_kvcache.report.outputs import formats, markdown, plots, terminal
from pytest_kvcache.run.folder import make_record
from pytest_kvcache.run.progress import requests_of
from pytest_kvcache.sample import Sample

#: A toy metric whose name says nothing (no ``_tps``/``_s``): everything the readers do with it comes from its
#: one entry.
TOY = Metric(
    "widgets",
    family="prefill rate",
    unit="widgets/s",
    direction="higher",
    label="widgets made (per s)",
    format="count",
)
#: A toy count: summarised, never compared.
TOY_COUNT = Metric("spare_parts", family=None, unit="parts", direction="lower", compared=False, format="count")


@pytest.fixture
def toys() -> Iterator[None]:
    catalogue.register(TOY)
    catalogue.register(TOY_COUNT)
    yield
    catalogue.unregister(TOY.name)
    catalogue.unregister(TOY_COUNT.name)


def toy_run(tmp_path: Path) -> RunData:
    """Two arms, one boot each, a user probe measuring the toys: arm b makes about twice a's widgets."""
    spec = ProbeSpec(name="toy", title="Toy probe", metrics=("widgets", "spare_parts"), primary_metric="widgets")
    records: list[Record] = []
    for arm, level in (("a", 1000.0), ("b", 2000.0)):
        for i in range(8):
            sample = Sample(ok=True, first_token_s=0.1, last_token_s=1.1, end_s=1.2, completion_tokens=100)
            rec = make_record(
                sample, run_id="r", arm=arm, boot=f"{arm}#1", replicate=1, probe="toy", shape="x", phase="measured"
            )
            rec["index"] = i
            rec["metrics"] = {"widgets": level + 10.0 * (i % 4), "spare_parts": 3.0 + i % 2}
            records.append(rec)
    meta = {
        "settings": {"arms": [{"name": "a"}, {"name": "b"}], "seed": 0},
        "probes": [spec.to_dict()],
    }
    return RunData(path=tmp_path, meta=meta, records=records)  # type: ignore[arg-type]


def test_before_its_entry_a_metric_is_read_from_its_name() -> None:
    metric = catalogue.get("widgets")
    assert not metric.declared
    assert (metric.direction, metric.family, metric.label, metric.compared) == ("lower", None, "widgets", True)
    assert formats.fmt(1234.5, "widgets") == "1,234.50"
    rate, time = catalogue.get("my_probe_tps"), catalogue.get("queue_s")
    assert (rate.direction, rate.family, rate.label) == ("higher", "decode rate", "my_probe_tps (tokens/s)")
    assert (time.direction, time.family, time.text(0.25)) == ("lower", "latency", "250 ms")


@pytest.mark.usefixtures("toys")
def test_one_entry_gives_a_new_metric_its_direction_family_label_and_format() -> None:
    assert catalogue.higher_is_better("widgets") and stats.verdict("widgets", 1.5, 2.5) == "better"
    assert stats.verdict("widgets", 0.5, 0.8) == "worse"
    assert catalogue.family("widgets") == "prefill rate"
    band = bands.band("widgets", "cpu")
    assert band is not None and band.family == "prefill rate"
    assert catalogue.label("widgets") == "widgets made (per s)"
    assert formats.fmt(1234.5, "widgets") == "1,234" and formats.fmt(None, "widgets") == "–"
    spec = ProbeSpec(name="toy", title="Toy", metrics=("widgets", "spare_parts"), primary_metric="widgets")
    assert spec.compared_metrics == ("widgets",)


@pytest.mark.usefixtures("toys")
def test_the_report_compares_formats_and_labels_a_new_metric(tmp_path: Path) -> None:
    report = build(toy_run(tmp_path))
    deltas = [d for d in report["deltas"] if d["probe"] == "toy"]
    assert [d["metric"] for d in deltas] == ["widgets"]  # the count is only summarised
    assert deltas[0]["direction"] == "higher" and deltas[0]["verdict"] == "better"
    assert {s["metric"] for s in report["summary"] if s["probe"] == "toy"} == {"widgets", "spare_parts"}
    text = markdown.markdown(report)
    # the count format and the band family, from the entry
    assert "| toy x widgets | 1,015 (n=8) | 2,015 (n=8) | +98.5% [" in text
    assert "better (1 boot per arm: within-boot CI widened by the default CPU prefill rate band)" in text
    assert "| toy x spare_parts | 4 (n=8) | 4 (n=8) | – |" in text
    lines = "\n".join(terminal.summary_lines(report))
    assert "2,015" in lines and "2,015.00" not in lines
    assert "toy.png" in plots.render(report)


def test_unregistering_a_stock_metric_restores_its_declaration() -> None:
    catalogue.register(Metric("ttft_s", "latency", "s", "higher"))
    assert catalogue.higher_is_better("ttft_s")
    catalogue.unregister("ttft_s")
    assert not catalogue.higher_is_better("ttft_s") and catalogue.get("ttft_s").label == "time to first token (s)"


def test_a_bad_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="family"):
        Metric("x", family="speed", unit="", direction="higher")
    with pytest.raises(ValueError, match="direction"):
        Metric("x", family=None, unit="", direction="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identifier"):
        catalogue.register(Metric("x-y", family=None, unit="", direction="higher"))


def test_every_stock_probe_metric_and_client_measure_is_declared() -> None:
    for spec in registry.STOCK:
        assert catalogue.undeclared(spec.metrics) == [], spec.name
    metrics, _, _ = Sample(ok=True, first_token_s=0.1, last_token_s=1.1, end_s=1.2, completion_tokens=100).measures()
    assert tuple(metrics) == registry.CLIENT_METRICS == catalogue.names("client")
    assert registry.COUNT_METRICS == ("prompt_tokens", "cached_tokens")
    assert all(not catalogue.compared(m) for m in registry.COUNT_METRICS)


def test_the_committed_noise_bands_name_the_catalogue_families() -> None:
    text = resources.files("pytest_kvcache").joinpath("data", bands.FILE).read_text(encoding="utf-8")
    stored = json.loads(text)["families"]
    assert {k: set(v) for k, v in stored.items()} == {k: set(v) for k, v in catalogue.families().items()}
    assert tuple(stored) == catalogue.FAMILIES


def test_a_probe_plans_its_request_count_from_its_spec() -> None:
    settings = Settings(arms=(), runs=7, depth_runs=3, turns=11)

    def of(probe: str) -> int | None:
        return requests_of({"probe": probe}, settings)  # type: ignore[typeddict-item]

    assert (of("short"), of("prefill"), of("agentic"), of("concurrency")) == (7, 3, 11, 7)
    assert of("fidelity") is None and of("capacity") is None and of("nobody") is None
    spec = ProbeSpec(name="mine", title="Mine", metrics=("decode_tps",), primary_metric="decode_tps")
    assert spec.planned_requests(settings) is None
    assert spec.__class__(**{**spec.__dict__, "requests_option": "turns"}).planned_requests(settings) == 11


def test_every_rate_is_better_higher_and_every_time_lower() -> None:
    for metric in catalogue.declared():
        if metric.unit == "tokens/s":
            assert metric.direction == "higher", metric.name  # stream_tps_median was "worse" when faster
        if metric.unit == "s":
            assert metric.direction == "lower" and metric.format == "seconds", metric.name
