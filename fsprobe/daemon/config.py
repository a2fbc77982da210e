"""The daemon's configuration: a TOML file, `FSPROBE_*` environment variables, CLI flags on top.

Everything is checked before the daemon starts or a reload is taken, and a refusal names the
file, the line and the key (``targets[1].write_interval``). Bounds: docs/security.md.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsprobe.lustre.runner import absolute_binary
from fsprobe.policy import DEFAULT_INTERVALS, Policy
from fsprobe.probing.plan import ProbeSettings
from fsprobe.probing.target import check_probe_as
from fsprobe.quota import ServerProbeSettings
from fsprobe.quota.ids import id_of
from fsprobe.quota.settings import cache_seconds_for
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.state import default_state_dir
from fsprobe.units import check_number, format_bytes, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

DEFAULT_LISTEN = "127.0.0.1:9731"
LOG_LEVELS = ("debug", "info", "warning", "error")
QUOTA_PROBE_MODES = ("auto", "always", "never")
#: The probe kinds that only run where quota probing is enabled (they cost server RPCs).
QUOTA_KINDS = ("quota", "lfs_df")
#: `lfs df` runs every `lfs_df_interval` while the filesystem and every MDT and OST a new file
#: can meet have at least this much free, else as often as quota (`fsprobe.daemon.pace`).
LFS_DF_TIGHT_RATIO = 0.20
#: The shortest interval accepted: below it the scheduler would do little but wake up.
MIN_INTERVAL = 0.1
#: Upper bounds. TOML allows `inf`, `nan` and 64-bit integers; a value past these is a typo or
#: an attack, never a wish: `deadline = inf` would overflow a timer, `write_bytes = "8G"` would
#: allocate 8 GiB in the probe worker beside every training job.
MAX_INTERVAL = 7 * 86400.0
MAX_DEADLINE = 3600.0
MAX_WRITE_BYTES = 64 * 1024 * 1024
MAX_GRACE_WARNING = 366 * 86400.0
MAX_SLOW_SECONDS = 86400.0
MAX_WINDOW = 100
MAX_STALE_INTERVALS = 1000.0
#: The highest uid/gid/project ID (2^32 - 1 is (uid_t)-1, "no ID", in every Linux interface).
MAX_ID = 2**32 - 2
#: A config file is a page of settings; reading more than this is refused, not attempted.
MAX_FILE_BYTES = 1024 * 1024
#: How often the checkpoints redirected away from a target are counted (and, if asked, synced).
REDIRECT_INTERVAL = 60.0


class ConfigError(Exception):
    """A configuration that cannot be used: where (file, line, key) and why."""

    def __init__(
        self, reason: str, file: str | None = None, line: int | None = None, key: str | None = None
    ) -> None:
        self.reason, self.file, self.line, self.key = reason, file, line, key
        where = ":".join(str(part) for part in (file, line) if part is not None)
        prefix = ": ".join(part for part in (where, key) if part)
        super().__init__(f"{prefix}: {reason}" if prefix else reason)


@dataclass(frozen=True)
class TargetConfig:
    """One watched directory: how it is probed (`settings`), how often, and its fallbacks."""

    path: str
    settings: ProbeSettings
    intervals: Mapping[str, float]
    quota_enabled: bool = True
    server_probes_elsewhere: str | None = None  # why quota and lfs df do not run here
    lfs_df_enabled: bool = True  # the per-OST series; quota runs without them
    #: below this free ratio somewhere a new file can land, `lfs df` runs as often as quota
    lfs_df_tight_ratio: float = LFS_DF_TIGHT_RATIO
    fallback_dirs: tuple[str, ...] = ()
    sync_redirected: bool = False  # copy redirected checkpoints back once the target is healthy
    redirect_interval: float = REDIRECT_INTERVAL  # of the daemon's tasks, not a probe


@dataclass(frozen=True)
class Config:
    """Everything `fsprobe run` needs, merged from file, environment and flags."""

    targets: tuple[TargetConfig, ...]
    listen: str = DEFAULT_LISTEN
    state_dir: str = field(default_factory=default_state_dir)
    textfile_dir: str | None = None
    web_config: str | None = None
    log_level: str = "info"
    sync_redirected: bool = False
    source: str | None = None  # the config file, if any

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


@dataclass(frozen=True)
class Overrides:
    """What the command line says; `None` means "not given" (the environment or file decide)."""

    paths: tuple[str, ...] = ()
    config_file: str | None = None
    listen: str | None = None
    state_dir: str | None = None
    textfile_dir: str | None = None
    web_config: str | None = None
    lfs: str | None = None
    lctl: str | None = None
    log_level: str | None = None
    sync_redirected: bool | None = None


# -- value checkers: (value) -> converted value, or _Invalid(reason) ---------------------------


class _Invalid(Exception):
    pass


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _number_in(
    low: float,
    high: float,
    above: bool = False,
    whole: bool = False,
    kind: str | None = None,
    hint: str = "",
) -> Callable[[Any], float]:
    """A finite number from `low` (above it when `above`) to `high` (`check_number`)."""

    def check(value: Any) -> float:
        try:
            check_number(value, low, high, above=above, whole=whole, kind=kind)
        except TypeError as error:
            raise _Invalid(f"expected {error}{hint}, got {_describe(value)}") from None
        except ValueError as error:
            raise _Invalid(f"expected {error}{hint}, got {value!r}") from None
        return value if whole else float(value)

    return check


def _seconds(low: float, high: float) -> Callable[[Any], float]:
    return _number_in(low, high, kind="a number of seconds")


_ratio = _number_in(0, 1, kind="a ratio", hint=" (0.1 is 10 %)")


def _whole(low: int, high: int, kind: str = "a whole number") -> Callable[[Any], int]:
    return _number_in(low, high, whole=True, kind=kind)  # type: ignore[return-value]


def _account(kind: str) -> Callable[[Any], int]:
    """A uid or gid as a number or a name (resolved now, with pwd/grp); projects as numbers."""
    numeric = _whole(0, MAX_ID, "a numeric ID")

    def check(value: Any) -> int:
        if isinstance(value, str) and kind != "project":
            try:
                return id_of(kind, value)
            except KeyError:
                raise _Invalid(f"no {kind} named {value!r} on this system") from None
        return numeric(value)

    return check


def _probe_as(value: Any) -> str:
    """Who probes a target: "owner", "root" or an account of this host (checked now)."""
    try:
        return check_probe_as(_string(value))
    except ValueError as error:
        raise _Invalid(str(error)) from None


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_describe(value)}")
    return value


def _string(value: Any) -> str:
    """A non-empty string without NUL (which no path, binary or address can hold)."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise _Invalid(f"expected a non-empty string, got {_describe(value)}")
    return value


def _size(high: int, high_text: str) -> Callable[[Any], int]:
    """A size in bytes (``"1M"`` or 1048576), above zero and at most `high` (`high_text`)."""

    def check(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        elif isinstance(value, str):
            try:
                size = parse_size(value)
            except ValueError as error:
                raise _Invalid(str(error)) from None
        else:
            raise _Invalid(f'expected a size such as "1M" or 1048576, got {_describe(value)}')
        if not 0 < size <= high:
            raise _Invalid(f"expected a size above zero and at most {high_text}, got {value!r}")
        return size

    return check


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise _Invalid(f"expected one of {', '.join(choices)}, got {_describe(value)}")
        return value

    return check


def _string_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(
        isinstance(item, str) and item and "\0" not in item for item in value
    ):
        raise _Invalid(f"expected a list of paths, got {_describe(value)}")
    return tuple(value)


def _listen(value: Any) -> str:
    text = _string(value)
    try:
        parse_listen(text)
    except ValueError as error:
        raise _Invalid(str(error)) from None
    return text


_PROBE_KEYS: dict[str, Callable[[Any], Any]] = {
    **{f"{kind}_interval": _seconds(MIN_INTERVAL, MAX_INTERVAL) for kind in DEFAULT_INTERVALS},
    "redirect_interval": _seconds(MIN_INTERVAL, MAX_INTERVAL),
    "deadline": _seconds(MIN_INTERVAL, MAX_DEADLINE),
    "quota_timeout": _seconds(MIN_INTERVAL, MAX_DEADLINE),
    "write_bytes": _size(MAX_WRITE_BYTES, "64M"),
    "write_probe": _bool,
    "probe_as": _probe_as,
    "quota_provider": _choice("auto", "lfs", "none"),
    "quota_probe": _choice(*QUOTA_PROBE_MODES),
    "lfs_df_probe": _bool,
    "lfs_df_tight_ratio": _ratio,
    "lfs": _string,
    "lctl": _string,
}
_THRESHOLD_KEYS: dict[str, Callable[[Any], Any]] = {
    "headroom_degraded_ratio": _ratio,
    "headroom_unhealthy_ratio": _ratio,
    "grace_expiring_seconds": _seconds(0, MAX_GRACE_WARNING),
    "lustre_target_min_free_ratio": _ratio,
    "write_slow_seconds": _seconds(0, MAX_SLOW_SECONDS),
    "write_very_slow_seconds": _seconds(0, MAX_SLOW_SECONDS),
    "transient_write_window": _whole(1, MAX_WINDOW),
    "stale_after_intervals": _number_in(0, MAX_STALE_INTERVALS, above=True),
    "check_tmpdir": _bool,
}
_TARGET_KEYS: dict[str, Callable[[Any], Any]] = {
    "path": _string,
    **_PROBE_KEYS,
    "fallback_dirs": _string_list,
    "user": _account("user"),
    "group": _account("group"),
    "project": _account("project"),
}
_TOP_KEYS: dict[str, Callable[[Any], Any]] = {
    "listen": _listen,
    "state_dir": _string,
    "textfile_dir": _string,
    "web_config": _string,
    "log_level": _choice(*LOG_LEVELS),
    "sync_redirected": _bool,
}


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (every interface) → (host, port)."""
    match = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text)
    if match is None or int(match["port"]) > 65535:
        raise ValueError(
            f"not a listen address: {text!r} (try 127.0.0.1:9731, [::1]:9731 or :9731)"
        )
    host = match["v6"] if match["v6"] is not None else match["host"]
    return host or "0.0.0.0", int(match["port"])


# -- locating a key in the file, for error messages ---------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\s\"]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"\s]+?)\s*=")


def _split_dotted(text: str) -> tuple[str, ...]:
    return tuple(part.strip().strip('"') for part in text.split("."))


def locate(text: str, path: Sequence[str | int]) -> int | None:
    """The line (1-based) where the key `path` (``("targets", 1, "deadline")``) is written.

    Best effort for the usual layout of tables, arrays of tables and dotted keys; an inline
    table is not looked into (the error then names the key without a line).
    """
    wanted = tuple(path)
    table: tuple[str | int, ...] = ()
    arrays: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            name = _split_dotted(header[2])
            if header[1] == "[[":
                arrays[name] = arrays.get(name, -1) + 1
            table = ()
            for depth, part in enumerate(name, start=1):
                table = (*table, part)
                if name[:depth] in arrays:  # [targets.thresholds]: of the latest [[targets]]
                    table = (*table, arrays[name[:depth]])
            if table == wanted:
                return number
            continue
        key = _KEY.match(line)
        if key and (*table, *_split_dotted(key[1])) == wanted:
            return number
    return None


# -- reading and merging --------------------------------------------------------------------------


def _key_name(path: Sequence[str | int]) -> str:
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else part)
    return name


class _Reader:
    """Checks a parsed TOML document against the schema, raising located ConfigErrors."""

    def __init__(self, file: str, text: str) -> None:
        self.file, self.text = file, text

    def error(self, path: Sequence[str | int], reason: str) -> ConfigError:
        return ConfigError(reason, self.file, locate(self.text, path), _key_name(path))

    def table(self, value: Any, path: tuple[str | int, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a table, got {_describe(value)}")
        return value

    def fields(
        self,
        table: Mapping[str, Any],
        path: tuple[str | int, ...],
        schema: Mapping[str, Callable[[Any], Any]],
        tables: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Check every key of `table` against `schema`; `tables` names allowed sub-tables."""
        checked = {}
        for key, value in table.items():
            if key in tables:
                continue
            checker = schema.get(key)
            if checker is None:
                known = ", ".join(sorted([*schema, *tables]))
                raise self.error((*path, key), f"unknown key (known keys: {known})")
            try:
                checked[key] = checker(value)
            except _Invalid as invalid:
                raise self.error((*path, key), str(invalid)) from None
        return checked


@dataclass(frozen=True)
class _FileSettings:
    """What a config file says, checked, before environment and flags are applied."""

    top: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    default_thresholds: Mapping[str, Any] = field(default_factory=dict)
    targets: tuple[tuple[Mapping[str, Any], Mapping[str, Any]], ...] = ()
    base_dir: str = "."


def _read_bounded(file: str) -> bytes:
    """The file's bytes: a regular file of at most `MAX_FILE_BYTES`, never a FIFO to wait on."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        raw = stream.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {format_bytes(MAX_FILE_BYTES)}")
    return raw


def _read_file(file: str) -> _FileSettings:
    try:
        raw = _read_bounded(file)
    except OSError as error:
        raise ConfigError(f"cannot read the config file: {error.strerror or error}", file) from None
    text = raw.decode("utf-8", errors="replace")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None) or _line_of_decode_error(str(error))
        reason = re.sub(r"\s*\(at line \d+, column \d+\)$", "", str(error))
        raise ConfigError(f"not valid TOML: {reason}", file, line) from None

    reader = _Reader(file, text)
    top = reader.fields(document, (), _TOP_KEYS, tables=("defaults", "targets"))
    defaults = reader.table(document.get("defaults", {}), ("defaults",))
    default_values = reader.fields(defaults, ("defaults",), _PROBE_KEYS, tables=("thresholds",))
    base_dir = os.path.dirname(file) or "."
    for tool in ("lfs", "lctl"):  # a relative path in the file: relative to the file
        if tool in default_values:
            default_values[tool] = absolute_binary(default_values[tool], base_dir)
    default_thresholds = reader.fields(
        reader.table(defaults.get("thresholds", {}), ("defaults", "thresholds")),
        ("defaults", "thresholds"),
        _THRESHOLD_KEYS,
    )
    raw_targets = document.get("targets", [])
    if not isinstance(raw_targets, list):
        raise reader.error(("targets",), "expected an array of tables: write [[targets]]")
    targets = []
    for index, raw_target in enumerate(raw_targets):
        path = ("targets", index)
        target = reader.table(raw_target, path)
        values = reader.fields(target, path, _TARGET_KEYS, tables=("thresholds",))
        if "path" not in values:
            raise reader.error(path, "a target needs a path")
        values["path"] = _absolute(values["path"], base_dir)
        for tool in ("lfs", "lctl"):
            if tool in values:
                values[tool] = absolute_binary(values[tool], base_dir)
        if "fallback_dirs" in values:
            values["fallback_dirs"] = tuple(_absolute(d, base_dir) for d in values["fallback_dirs"])
        thresholds = reader.fields(
            reader.table(target.get("thresholds", {}), (*path, "thresholds")),
            (*path, "thresholds"),
            _THRESHOLD_KEYS,
        )
        targets.append((values, thresholds))
    settings = _FileSettings(
        top, default_values, default_thresholds, tuple(targets), os.path.dirname(file) or "."
    )
    _check_consistency(reader, settings)
    return settings


def _line_of_decode_error(message: str) -> int | None:
    match = re.search(r"at line (\d+)", message)
    return int(match[1]) if match else None


def _check_consistency(reader: _Reader, settings: _FileSettings) -> None:
    """Rules between keys: thresholds in the right order, no target twice."""
    scopes: list[tuple[tuple[str | int, ...], Mapping[str, Any]]] = [
        (("defaults", "thresholds"), settings.default_thresholds)
    ]
    scopes += [
        (("targets", index, "thresholds"), {**settings.default_thresholds, **thresholds})
        for index, (_values, thresholds) in enumerate(settings.targets)
    ]
    for path, thresholds in scopes:
        merged = {**dataclasses.asdict(Policy()), **thresholds}
        for low, high in (
            ("headroom_unhealthy_ratio", "headroom_degraded_ratio"),
            ("write_slow_seconds", "write_very_slow_seconds"),
        ):
            if merged[low] > merged[high]:
                key = low if low in thresholds else high
                raise reader.error(
                    (*path, key), f"{low} ({merged[low]}) must not exceed {high} ({merged[high]})"
                )
    seen: dict[str, int] = {}
    for index, (values, _thresholds) in enumerate(settings.targets):
        target = _absolute(values["path"], settings.base_dir)
        if target in seen:
            raise reader.error(
                ("targets", index, "path"), f"{target} is already targets[{seen[target]}]"
            )
        seen[target] = index


def _absolute(path: str, base_dir: str) -> str:
    return os.path.abspath(os.path.join(base_dir, os.path.expanduser(path)))


#: Which process of a job this is: across the job (Slurm's task, torchrun's or an MPI launcher's
#: rank, a Kubernetes indexed job's completion index), and then on its node.
GLOBAL_RANK_VARIABLES = ("SLURM_PROCID", "RANK", "JOB_COMPLETION_INDEX")
LOCAL_RANK_VARIABLES = ("SLURM_LOCALID", "LOCAL_RANK")


def server_probes_elsewhere(mode: str, environ: Mapping[str, str]) -> str | None:
    """Why this process does not run the quota and `lfs df` probes, or None if it does
    (docs/design.md §8).

    `auto`: inside a job, only its global rank 0 does (every global rank variable set is 0):
    the sidecars of a job ask about the same IDs, so one question per job and ID reaches the
    servers, not one per node. Without a global rank, local rank 0 of the node (SLURM_LOCALID
    before LOCAL_RANK); outside of a job (a node daemon), always.
    """
    if mode != "auto":
        return None if mode == "always" else 'quota_probe = "never"'
    found = {v: environ[v].strip() for v in GLOBAL_RANK_VARIABLES if environ.get(v, "").strip()}
    who = "the job's global rank 0"
    if not found:  # Slurm's word first, as it always was
        local = next((v for v in LOCAL_RANK_VARIABLES if environ.get(v, "").strip()), None)
        found = {local: environ[local].strip()} if local else {}
        who = "local rank 0 of this node"
    if all(value == "0" for value in found.values()):
        return None
    here = ", ".join(f"{variable}={value}" for variable, value in found.items())
    return f"{who} asks lfs quota and lfs df for this job ({here} here)"


def quota_probes_enabled(mode: str, environ: Mapping[str, str]) -> bool:
    """Whether this process runs the quota and `lfs df` probes (`server_probes_elsewhere`)."""
    return server_probes_elsewhere(mode, environ) is None


def _target(
    path: str,
    values: Mapping[str, Any],
    thresholds: Mapping[str, Any],
    lfs_override: str | None,
    lctl_override: str | None,
    environ: Mapping[str, str],
    sync_redirected: bool,
) -> TargetConfig:
    """Build one target from the merged defaults and its own keys."""
    intervals = {
        kind: values.get(f"{kind}_interval", default) for kind, default in DEFAULT_INTERVALS.items()
    }
    base_quota = ServerProbeSettings()
    quota = dataclasses.replace(
        base_quota,
        provider=values.get("quota_provider", base_quota.provider),
        lfs=lfs_override or values.get("lfs") or base_quota.lfs,
        lctl=lctl_override or values.get("lctl") or base_quota.lctl,
        user=values.get("user"),
        group=values.get("group"),
        project=values.get("project"),
        timeout=values.get("quota_timeout", base_quota.timeout),
        cache_seconds=cache_seconds_for(intervals["quota"]),
    )
    base = ProbeSettings()
    settings = ProbeSettings(
        deadline=values.get("deadline", base.deadline),
        write_probe=values.get("write_probe", base.write_probe),
        write_bytes=values.get("write_bytes", base.write_bytes),
        probe_as=values.get("probe_as", base.probe_as),
        server_probes=quota,
        policy=Policy(**thresholds, intervals=intervals),
    )
    mode = values.get("quota_probe", "auto")
    return TargetConfig(
        path=path,
        settings=settings,
        intervals=intervals,
        quota_enabled=quota_probes_enabled(mode, environ),
        server_probes_elsewhere=server_probes_elsewhere(mode, environ),
        lfs_df_enabled=values.get("lfs_df_probe", True),
        lfs_df_tight_ratio=values.get("lfs_df_tight_ratio", LFS_DF_TIGHT_RATIO),
        fallback_dirs=all_fallback_dirs(values.get("fallback_dirs", ()), environ),
        sync_redirected=sync_redirected,
        redirect_interval=values.get("redirect_interval", REDIRECT_INTERVAL),
    )


def load_target(
    config_file: str, path: str, environ: Mapping[str, str] = os.environ
) -> TargetConfig:
    """How `path` is probed and judged under `config_file`: as the file's own target when the
    file lists `path` (its overrides apply), else with the file's ``[defaults]``.

    For `fsprobe check --config`, so that a one-off check judges by the daemon's thresholds.
    Paths are compared as text, made absolute: the target is never touched here.
    """
    file = _read_file(config_file)
    absolute = os.path.abspath(os.path.expanduser(path))
    for values, thresholds in file.targets:
        if values["path"] == absolute:
            merged = {**file.defaults, **values}
            return _target(
                absolute,
                merged,
                {**file.default_thresholds, **thresholds},
                None,
                None,
                environ,
                False,
            )
    return _target(absolute, file.defaults, file.default_thresholds, None, None, environ, False)


def _from_environment(environ: Mapping[str, str], name: str, check: Callable[[Any], Any]) -> Any:
    value = environ.get(name)
    if not value:
        return None
    try:
        return check(value)
    except _Invalid as invalid:
        raise ConfigError(str(invalid), key=name) from None


def load(overrides: Overrides, environ: Mapping[str, str] = os.environ) -> Config:
    """The configuration to run with: file < `FSPROBE_*` environment < command line.

    Targets are those of the file plus the PATHs of the command line (which use the file's
    `[defaults]`); a PATH that the file also lists keeps the file's overrides.
    """
    config_file = overrides.config_file or environ.get("FSPROBE_CONFIG") or None
    file = _read_file(config_file) if config_file else _FileSettings()

    def pick(name: str, check: Callable[[Any], Any] = _string) -> Any:
        given = getattr(overrides, name)
        if given is not None:
            try:
                return check(given)
            except _Invalid as invalid:
                raise ConfigError(str(invalid), key=f"--{name.replace('_', '-')}") from None
        from_env = _from_environment(environ, f"FSPROBE_{name.upper()}", check)
        if from_env is not None:
            return from_env
        in_file = file.top.get(name)
        if in_file is not None and name in ("state_dir", "textfile_dir", "web_config"):
            return _absolute(in_file, file.base_dir)
        return in_file

    lfs = absolute_binary(overrides.lfs or environ.get("FSPROBE_LFS") or None)
    lctl = absolute_binary(overrides.lctl or environ.get("FSPROBE_LCTL") or None)
    sync_redirected = bool(
        overrides.sync_redirected
        if overrides.sync_redirected is not None
        else file.top.get("sync_redirected", False)
    )
    targets = [
        _target(
            values["path"],
            {**file.defaults, **values},
            {**file.default_thresholds, **thresholds},
            lfs,
            lctl,
            environ,
            sync_redirected,
        )
        for values, thresholds in file.targets
    ]
    listed = {target.path for target in targets}
    for path in overrides.paths:
        if not path or "\0" in path:
            raise ConfigError(f"not a directory name: {path!r}", key="PATH")
        absolute = os.path.abspath(os.path.expanduser(path))
        if absolute not in listed:
            listed.add(absolute)
            targets.append(
                _target(
                    absolute,
                    file.defaults,
                    file.default_thresholds,
                    lfs,
                    lctl,
                    environ,
                    sync_redirected,
                )
            )
    if not targets:
        raise ConfigError(
            "no target to watch: give a directory (`fsprobe run /path/to/ckpt`) or a config "
            "file with [[targets]] (--config FILE or FSPROBE_CONFIG)",
            config_file,
        )
    state_dir = pick("state_dir")
    return Config(
        targets=tuple(targets),
        listen=pick("listen", _listen) or DEFAULT_LISTEN,
        state_dir=os.path.abspath(state_dir) if state_dir else default_state_dir(environ),
        textfile_dir=_abspath_or_none(pick("textfile_dir")),
        web_config=_abspath_or_none(pick("web_config")),
        log_level=overrides.log_level or file.top.get("log_level", "info"),
        sync_redirected=sync_redirected,
        source=os.path.abspath(config_file) if config_file else None,
    )


def _abspath_or_none(path: str | None) -> str | None:
    return os.path.abspath(os.path.expanduser(path)) if path else None
