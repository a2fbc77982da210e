"""The text exposition of the metrics, cheap enough to serve on every scrape at 100 targets.

prometheus_client renders about 7 µs per sample line; a node daemon with 100 targets has some
16 000 lines (the write-latency histogram alone is 17 lines for each of 7 ops per target),
which costs over 100 ms per scrape. But a target's lines change only when that target's view
does, so they are rendered once per view version — by prometheus_client's own encoder, from the
very families the collector yields — and the histogram, most of the lines, only when a write
probe ends. The pieces are joined in the collector's order once per change, by the daemon
after each batch of results, so that a scrape only sends bytes that are ready. The result is
byte for byte what `generate_latest` gives for the registry (a test holds it to that).

Process metrics (`process_*`, `python_*`) change on every scrape and are small: they are
rendered fresh each time and sent first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from fsprobe.exporters.metrics import (
    FsprobeCollector,
    add_latency,
    add_values,
    build_info,
    empty_families,
)
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


@dataclass(frozen=True)
class _Rendered:
    """One target's sample lines per family, and the versions they were rendered from."""

    version: int
    latency_version: int
    latency: list[bytes]
    samples: list[bytes]


def _sample_lines(
    add: Callable[[dict[str, Metric], TargetView], None], view: TargetView
) -> list[bytes]:
    """The sample lines that `add` gives `view`, per family (``b""`` where it gives none).

    Only the families with samples go through the encoder: a target has samples in a few.
    """
    families = empty_families()
    add(families, view)
    ordered = list(families.values())
    filled = [index for index, family in enumerate(ordered) if family.samples]
    lines = [b""] * len(ordered)
    for index, (_header, samples) in zip(filled, _split(_encode(ordered[i] for i in filled))):
        lines[index] = samples
    return lines


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
        self._cache: dict[str, _Rendered] = {}
        self._text: tuple[tuple[int, ...], bytes] = ((), b"")
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
        if cached is not None and cached.version == view.version:
            return cached.samples
        if cached is not None and cached.latency_version == view.latency_version:
            latency = cached.latency
        else:
            latency = _sample_lines(add_latency, view)
        values = _sample_lines(add_values, view)
        rendered = _Rendered(
            view.version,
            view.latency_version,
            latency,
            [value or histogram for value, histogram in zip(values, latency)],
        )
        with self._lock:
            self._cache[view.path] = rendered
        return rendered.samples

    def warm(self, changed: Iterable[TargetView]) -> None:
        """Bring the cache up to date after a batch of results (the daemon calls this): render
        the changed targets, forget those no longer watched, and join the text a scrape sends."""
        for view in changed:
            self._samples(view)
        watched = {view.path for view in self._views()}
        with self._lock:
            for path in [path for path in self._cache if path not in watched]:
                del self._cache[path]
        self.fsprobe_text()

    def fsprobe_text(self) -> bytes:
        """The fsprobe metrics alone: what the textfile holds."""
        views = self._views()
        key = tuple(view.version for view in views)  # versions are unique across targets
        text_key, text = self._text
        if text_key == key:
            return text
        per_target = [self._samples(view) for view in views]
        parts = [self._build_info]
        # One column of sample lines per family, every target's in turn (transposed in C).
        columns = zip(*per_target) if per_target else [()] * len(self._headers)
        for header, column in zip(self._headers, columns):
            parts.append(header)
            parts.extend(column)
        text = b"".join(parts)
        self._text = (key, text)
        return text

    def render(self) -> tuple[bytes, bytes]:
        """What /metrics serves, in two pieces (no copy of the large one): process metrics
        (if any), then the fsprobe metrics."""
        return generate_latest(self._process), self.fsprobe_text()
