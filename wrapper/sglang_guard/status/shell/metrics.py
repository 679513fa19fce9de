"""The guard's Prometheus metrics: prometheus-client's metric classes, on a registry of its own.

Every counter with a known label set is registered at zero, so that a first restart shows
as 0 -> 1 (`increase()` sees it) rather than as a new series; the log rules' remediation
labels are registered at zero once the rule packs are known.

Only prometheus-client's light modules are imported (`_prometheus`): its package `__init__`
imports its exposition module, and that imports http.server, wsgiref, urllib.request, email
and ssl (~7 MiB of a guard's RSS) for servers and a push gateway the guard does not use. The
text format is written here (`text_format`), from the registry's own samples;
tests/unit/test_metrics_light.py holds it equal to prometheus-client's `generate_latest`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from sglang_guard import __version__
from sglang_guard.status.status import (
    FLEET_KINDS,
    GIVE_UP_REASONS,
    LAUNCH_REASONS,
    PHASES,
    RELOAD_OUTCOMES,
    RESTART_CAUSES,
    Counts,
    Snapshot,
)

PACKAGE = "prometheus_client"
LIGHT = ("metrics", "registry", "process_collector", "utils")  # what the guard uses of it


@functools.cache
def _prometheus() -> dict[str, ModuleType]:
    """prometheus-client's LIGHT modules, without running the package's `__init__`.

    While they import, `prometheus_client` is a bare package over its real directory (the
    import system's own module for its spec, not executed); then it leaves sys.modules
    again, so that a later `import prometheus_client` runs the real `__init__` (which finds
    these modules loaded). Where that fails (a layout this does not fit), or the package is
    imported already, the normal import.
    """
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is not None and spec.submodule_search_locations is not None:
            sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
            try:
                return {name: importlib.import_module(f"{PACKAGE}.{name}") for name in LIGHT}
            except (ImportError, AttributeError, NameError):
                for name in [m for m in sys.modules if m.startswith(f"{PACKAGE}.")]:
                    del sys.modules[name]  # half-imported: the normal import starts afresh
            finally:
                sys.modules.pop(PACKAGE, None)
    importlib.import_module(PACKAGE)
    return {name: importlib.import_module(f"{PACKAGE}.{name}") for name in LIGHT}


def text_format(registry: Any) -> bytes:
    """The Prometheus text format (0.0.4) of `registry`, as `generate_latest` writes it.

    The metric and label names are the guard's own (the legacy charset: no quoting); label
    values and help texts are escaped as the format says. Counters, gauges, histograms, info
    and enum (stateset) metrics; no gauge histograms, no `_created` series (turned off).
    """
    to_go = _prometheus()["utils"].floatToGoString
    out: list[str] = []
    for metric in registry.collect():
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name, kind = f"{name}_info", "gauge"
        else:  # OpenMetrics' types as the Prometheus text format names them
            kind = {"stateset": "gauge", "unknown": "untyped"}.get(kind, kind)
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for sample in metric.samples:
            labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(sample.labels.items()))
            stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
            out.append(f"{sample.name}{{{labels}}}" if labels else sample.name)
            out.append(f" {to_go(sample.value)}{stamp}\n")
    return "".join(out).encode("utf-8")


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


PREFIX = "sglang_guard"
# Loading a large model takes minutes, sometimes an hour; the buckets follow.
READY_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The counters, gauges and histogram the status port serves on /metrics."""

    def __init__(self, phase_seconds: Callable[[], float]) -> None:
        prom = _prometheus()
        Counter, Gauge, Histogram = (prom["metrics"].Counter, prom["metrics"].Gauge,
                                     prom["metrics"].Histogram)
        # `_created` series double the output and no alert reads them (the process's own).
        prom["metrics"].disable_created_metrics()
        self.registry = prom["registry"].CollectorRegistry(auto_describe=True)
        r = self.registry
        prom["process_collector"].ProcessCollector(registry=r)  # process_cpu_seconds_total, ...
        self.build_info = Gauge(f"{PREFIX}_build_info",
                                "1, labelled with the guard's and SGLang's versions",
                                ["version", "sglang_version"], registry=r)
        self._build: tuple[str, str] | None = None
        self.build("unknown")
        self.launches = Counter(f"{PREFIX}_launches", "SGLang launches, by reason",
                                ["reason"], registry=r)
        self.restarts = Counter(f"{PREFIX}_restarts", "SGLang restarts in place, by cause",
                                ["cause"], registry=r)
        self.remediations = Counter(f"{PREFIX}_remediations",
                                    "Command-line fixes, by trigger, rule, flag and action",
                                    ["trigger", "rule", "flag", "action"], registry=r)
        self.give_ups = Counter(f"{PREFIX}_give_ups", "Times the guard gave up, by reason",
                                ["reason"], registry=r)
        self.reloads = Counter(f"{PREFIX}_reloads", "Config reloads, by outcome",
                               ["outcome"], registry=r)
        self.fleet = Counter(f"{PREFIX}_fleet", "Fleet memory: lookups, hits, known-bad "
                             "skips, refused entries, publishes, confirmations, known-bad "
                             "marks and store errors", ["kind"], registry=r)
        self.phase = Gauge(f"{PREFIX}_phase", "The guard's phase (one-hot)", ["phase"],
                           registry=r)
        self.child_up = Gauge(f"{PREFIX}_child_up", "1 while an SGLang process runs",
                              registry=r)
        self.ready = Gauge(f"{PREFIX}_ready",
                           "1 when SGLang is ready (ready line and /health 200)", registry=r)
        self.generation = Gauge(f"{PREFIX}_generation", "The current launch number",
                                registry=r)
        self.stalled = Gauge(f"{PREFIX}_start_stalled",
                             "1 once a loading stage made no progress within its limit",
                             registry=r)
        self.phase_seconds = Gauge(f"{PREFIX}_phase_seconds", "Seconds in the current phase",
                                   registry=r)
        self.phase_seconds.set_function(phase_seconds)
        self.time_to_ready = Histogram(f"{PREFIX}_time_to_ready_seconds",
                                       "Seconds from a launch to ready", buckets=READY_BUCKETS,
                                       registry=r)
        for family, values in ((self.launches, LAUNCH_REASONS), (self.restarts, RESTART_CAUSES),
                               (self.give_ups, GIVE_UP_REASONS),
                               (self.reloads, RELOAD_OUTCOMES), (self.fleet, FLEET_KINDS)):
            for value in values:
                family.labels(value)
        self._known: set[tuple[str, str, str, str]] = set()
        self.show(Snapshot())

    def build(self, sglang_version: str | None) -> None:
        """The build_info series for this SGLang release (known once the release is read)."""
        labels = (__version__, sglang_version or "unknown")
        if labels == self._build:
            return
        if self._build is not None:
            self.build_info.remove(*self._build)
        self.build_info.labels(*labels).set(1)
        self._build = labels

    def known_remediations(self, labels: Iterable[tuple[str, str, str, str]]) -> None:
        """Register these (trigger, rule, flag, action) at zero (new ones only)."""
        for key in labels:
            if key not in self._known:
                self._known.add(key)
                self.remediations.labels(*key)

    def count(self, counts: Counts) -> None:
        """Add what one journal record counts."""
        if counts.launch:
            self.launches.labels(counts.launch).inc()
        if counts.restart:
            self.restarts.labels(counts.restart).inc()
        if counts.remediation:
            self._known.add(counts.remediation)
            self.remediations.labels(*counts.remediation).inc()
        if counts.give_up:
            self.give_ups.labels(counts.give_up).inc()
        if counts.reload:
            self.reloads.labels(counts.reload).inc()
        if counts.time_to_ready is not None:
            self.time_to_ready.observe(counts.time_to_ready)
        for kind in counts.fleet:
            self.fleet.labels(kind).inc()

    def show(self, snap: Snapshot) -> None:
        """Set the gauges from a snapshot."""
        for phase in PHASES:
            self.phase.labels(phase).set(1 if phase == snap.phase else 0)
        self.child_up.set(1 if snap.child_up else 0)
        self.ready.set(1 if snap.ready else 0)
        self.generation.set(snap.generation)
        self.stalled.set(1 if snap.stalled else 0)

    def exposition(self) -> bytes:
        """The text format of the registry."""
        return text_format(self.registry)
