"""The text exposition (format 0.0.4), each target's lines encoded once per view version.

Process metrics are rendered fresh by prometheus_client on every scrape (docs/design.md §8).
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.utils import floatToGoString

from fsprobe import __version__
from fsprobe.exporters.contained import InternalErrors, summary
from fsprobe.exporters.metrics import (
    BUILD_INFO,
    CACHED,
    CONFIG_RELOAD_SUCCESSFUL,
    CONFIG_RELOAD_TIMESTAMP,
    FAMILIES,
    INTERNAL_ERRORS,
    SAVE_EVENTS_DROPPED,
    Family,
    Sample,
    dropped_samples,
    internal_error_samples,
    target_samples,
    unrendered_samples,
)
from fsprobe.exporters.view import TargetView


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def encode_sample(sample: Sample) -> str:
    """One sample line of the text format."""
    labels = ",".join(
        f'{name}="{_escape_label(value)}"' for name, value in sorted(sample.labels.items())
    )
    return f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}\n"


def encode_header(family: Family, help_text: str) -> str:
    """The HELP and TYPE lines of a family (a counter's name carries its ``_total``)."""
    name = f"{family.name}_total" if family.kind == "counter" else family.name
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {family.kind}\n"


@dataclass(frozen=True)
class _Rendered:
    """One target's encoded lines per family (in `FAMILIES` order, ``b""`` where none)."""

    version: int
    lines: tuple[bytes, ...]


def _encode(version: int, by_family: dict[str, list[Sample]]) -> _Rendered:
    lines = tuple(
        "".join(encode_sample(sample) for sample in by_family.get(family.name, ())).encode()
        for family in FAMILIES
    )
    return _Rendered(version, lines)


@dataclass(frozen=True)
class ReloadStatus:
    """Whether the last (re)load of the configuration succeeded, and when one last did."""

    successful: bool
    success_at: float

    def encode(self) -> bytes:
        return (
            encode_header(CONFIG_RELOAD_SUCCESSFUL, CONFIG_RELOAD_SUCCESSFUL.help)
            + encode_sample(Sample(CONFIG_RELOAD_SUCCESSFUL.name, {}, float(self.successful)))
            + encode_header(CONFIG_RELOAD_TIMESTAMP, CONFIG_RELOAD_TIMESTAMP.help)
            + encode_sample(Sample(CONFIG_RELOAD_TIMESTAMP.name, {}, self.success_at))
        ).encode()


def _log_bug(path: str, stage: str, summary: str, trace: str) -> None:
    logging.getLogger(__name__).error(
        "event=internal_error target=%s stage=%s error=%s\n%s", path, stage, summary, trace
    )


class Exposition:
    """Renders the exposition from the latest views, caching each target's lines by version."""

    def __init__(
        self,
        views: Callable[[], Sequence[TargetView]],
        process_metrics: bool = True,
        dropped_events: Callable[[], Mapping[str, int]] | None = None,
        internal_errors: InternalErrors | None = None,
    ) -> None:
        """`views` returns the current views in path order, `dropped_events` the save events
        dropped so far by reason (rendered on every scrape: a few lines at most);
        `internal_errors` counts the bugs contained per target (the daemon's store shares its
        own)."""
        self._views = views
        self.reload_status: ReloadStatus | None = None  # a daemon's (not a --once run's)
        self._dropped_events = dropped_events
        self._dropped_header = encode_header(SAVE_EVENTS_DROPPED, SAVE_EVENTS_DROPPED.help)
        self.internal_errors = internal_errors or InternalErrors(_log_bug)
        self._lock = threading.Lock()
        self._cache: dict[str, _Rendered] = {}
        self._text: tuple[tuple[object, ...], bytes] = ((), b"")
        self._internal: tuple[tuple[tuple[str, ...], int], bytes] = (((), -1), b"")
        self._internal_header = encode_header(
            INTERNAL_ERRORS, f"{INTERNAL_ERRORS.help} {CACHED}"
        ).encode()
        self._build_info = (
            encode_header(BUILD_INFO, BUILD_INFO.help)
            + encode_sample(Sample(BUILD_INFO.name, {"version": __version__}, 1.0))
        ).encode()
        self._headers = [
            encode_header(family, f"{family.help} {CACHED}").encode() for family in FAMILIES
        ]
        self._process = CollectorRegistry(auto_describe=False)
        if process_metrics:
            self._process.register(ProcessCollector(registry=None))
            self._process.register(PlatformCollector(registry=None))

    def _lines(self, view: TargetView) -> tuple[bytes, ...]:
        with self._lock:
            cached = self._cache.get(view.path)
        if cached is None or cached.version != view.version:
            cached = self._render(view)
            with self._lock:
                self._cache[view.path] = cached
        return cached.lines

    def _render(self, view: TargetView) -> _Rendered:
        """One target's lines; a bug in rendering it costs that target its values (it reads
        unknown), never the other targets' lines or the scrape."""
        try:
            rendered = _encode(view.version, target_samples(view))
        except Exception as error:
            self.internal_errors.failed(
                view.path, "publish", summary(error), traceback.format_exc(), part="metrics"
            )
            return _encode(view.version, unrendered_samples(view.path))
        self.internal_errors.passed(view.path, "publish", part="metrics")
        return rendered

    def warm(self, changed: Iterable[TargetView]) -> None:
        """Bring the cache up to date after a batch of results (the daemon calls this): render
        the changed targets, forget those no longer watched, and join the text a scrape sends."""
        for view in changed:
            self._lines(view)
        watched = {view.path for view in self._views()}
        with self._lock:
            for path in [path for path in self._cache if path not in watched]:
                del self._cache[path]
        self.fsprobe_text()

    def fsprobe_text(self) -> bytes:
        """The fsprobe metrics alone: what the textfile holds."""
        views = self._views()
        # versions are unique across targets; the count of bugs changes without a view
        text_key, text = self._text
        reload_status = self.reload_status
        versions = tuple(view.version for view in views)
        if text_key == (versions, self.internal_errors.version, reload_status):
            return text  # every view's lines are in it already: nothing to look up per target
        per_target = [self._lines(view) for view in views]  # may count a bug: before the key
        key = (versions, self.internal_errors.version, reload_status)
        parts = [self._build_info]
        if reload_status is not None:
            parts.append(reload_status.encode())
        # One column of lines per family, every target's in turn (transposed in C).
        columns = zip(*per_target) if per_target else [()] * len(FAMILIES)
        for header, column in zip(self._headers, columns):
            parts.append(header)
            parts.extend(column)
        parts += [self._internal_header, self._internal_lines(views, self.internal_errors.version)]
        text = b"".join(parts)
        self._text = (key, text)
        return text

    def _internal_lines(self, views: Sequence[TargetView], version: int) -> bytes:
        """`fsprobe_internal_errors_total` of the watched targets, encoded again only when the
        targets or the counts changed (a path's label is escaped character by character)."""
        paths = tuple(view.path for view in views)
        key, lines = self._internal
        if key != (paths, version):
            bugs = internal_error_samples(paths, self.internal_errors.counts())
            lines = "".join(map(encode_sample, bugs)).encode()
            self._internal = ((paths, version), lines)
        return lines

    def render(self) -> tuple[bytes, bytes]:
        """What /metrics serves, in two pieces (no copy of the large one): process metrics
        (if any) and the dropped save events, then the fsprobe metrics."""
        fresh = generate_latest(self._process)
        if self._dropped_events is not None:
            lines = "".join(map(encode_sample, dropped_samples(self._dropped_events())))
            fresh += (self._dropped_header + lines).encode()
        return fresh, self.fsprobe_text()
