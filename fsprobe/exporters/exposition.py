"""The text exposition of the metrics, cheap enough to serve on every scrape at 100 targets.

prometheus_client renders about 7 µs per sample line; a node daemon with 100 targets has some
16 000 lines (the write-latency histogram alone is 17 lines for each of 7 ops per target),
which costs over 100 ms per scrape. But a target's lines change only when that target's view
does, so they are rendered once per view version — by prometheus_client's own encoder, from the
very families the collector yields — and a scrape only joins the cached pieces in the
collector's order. The result is byte for byte what `generate_latest` gives for the registry
(a test holds it to that).

Process metrics (`process_*`, `python_*`) change on every scrape and are small: they are
rendered fresh each time and put first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from fsprobe.exporters.metrics import FsprobeCollector, build_info, empty_families, target_families
from fsprobe.exporters.view import TargetView


class _Families(Collector):
    """A collector over a fixed list of families: feeds prometheus_client's encoder."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _encode(families: Iterable[Metric]) -> bytes:
    return generate_latest(_Families(families))  # type: ignore[arg-type]


def _split(text: bytes) -> list[tuple[bytes, bytes]]:
    """Encoded families → [(HELP and TYPE lines, sample lines)], one pair per family.

    Sample lines never start with ``#`` and never hold a raw newline (label values escape it),
    so every line that starts with ``# HELP`` begins a family.
    """
    blocks: list[tuple[list[bytes], list[bytes]]] = []
    for line in text.split(b"\n")[:-1]:
        line += b"\n"
        if line.startswith(b"# HELP "):
            blocks.append(([line], []))
        elif line.startswith(b"# TYPE "):
            blocks[-1][0].append(line)
        else:
            blocks[-1][1].append(line)
    return [(b"".join(header), b"".join(samples)) for header, samples in blocks]


class Exposition:
    """Renders the exposition from the latest views, caching each target's lines by version."""

    def __init__(
        self, views: Callable[[], Sequence[TargetView]], process_metrics: bool = True
    ) -> None:
        """`views` returns the current views in path order.

        `registry` is the daemon's own CollectorRegistry (process metrics and the fsprobe
        collector): what `render()` is the fast equivalent of.
        """
        self._views = views
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[int, list[bytes]]] = {}
        self._build_info = _encode([build_info()])
        self._headers = [header for header, _samples in _split(_encode(empty_families().values()))]
        self._process = CollectorRegistry(auto_describe=False)
        self.registry = CollectorRegistry(auto_describe=False)
        if process_metrics:
            for collector in (ProcessCollector(registry=None), PlatformCollector(registry=None)):
                self._process.register(collector)
                self.registry.register(collector)
        self.registry.register(FsprobeCollector(views))

    def _samples(self, view: TargetView) -> list[bytes]:
        with self._lock:
            cached = self._cache.get(view.path)
        if cached is not None and cached[0] == view.version:
            return cached[1]
        samples = [lines for _header, lines in _split(_encode(target_families([view])))]
        with self._lock:
            self._cache[view.path] = (view.version, samples)
        return samples

    def warm(self, changed: Iterable[TargetView]) -> None:
        """Render the changed targets now (the daemon calls this after each batch of results),
        so that a scrape finds everything cached; forget targets that are no longer watched."""
        for view in changed:
            self._samples(view)
        watched = {view.path for view in self._views()}
        with self._lock:
            for path in [path for path in self._cache if path not in watched]:
                del self._cache[path]

    def fsprobe_text(self) -> bytes:
        """The fsprobe metrics alone: what the textfile holds."""
        per_target = [self._samples(view) for view in self._views()]
        parts = [self._build_info]
        for index, header in enumerate(self._headers):
            parts.append(header)
            parts.extend(samples[index] for samples in per_target)
        return b"".join(parts)

    def render(self) -> bytes:
        """What /metrics serves: process metrics (if any), then the fsprobe metrics."""
        return generate_latest(self._process) + self.fsprobe_text()
