"""`fsprobe run [PATH ...]`: the sidecar / node daemon."""

from __future__ import annotations

import click

from fsprobe.cli.exits import EXIT_SOFTWARE, EXIT_UNAVAILABLE, EXIT_USAGE
from fsprobe.cli.options import absolute_lfs
from fsprobe.cli.render import render_summary
from fsprobe.daemon import config as configuration
from fsprobe.daemon import logs
from fsprobe.daemon.lifecycle import Daemon, StartupError, run_once
from fsprobe.model import Status


class _ConfigProblem(click.ClickException):
    exit_code = EXIT_USAGE


class _CannotStart(click.ClickException):
    exit_code = EXIT_UNAVAILABLE


@click.command()
# Plain strings, not click.Path: checking them would stat them here, and hang on a hung mount.
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="TOML file with defaults and [[targets]] [env FSPROBE_CONFIG].",
)
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Serve /metrics here [env FSPROBE_LISTEN; default 127.0.0.1:9731]. "
    "[::1]:9731 for IPv6, :9731 for every interface.",
)
@click.option(
    "--state-dir",
    metavar="DIR",
    help="Write state.json here for the save hook and `fsprobe status` [env FSPROBE_STATE_DIR; "
    "default $XDG_RUNTIME_DIR/fsprobe, else /tmp/fsprobe-UID].",
)
@click.option(
    "--textfile-dir",
    metavar="DIR",
    help="Also write DIR/fsprobe.prom for node_exporter's textfile collector "
    "[env FSPROBE_TEXTFILE_DIR].",
)
@click.option(
    "--web-config",
    metavar="FILE",
    help="TLS and basic auth for /metrics, in the format of Prometheus' exporters "
    "[env FSPROBE_WEB_CONFIG]. Needs fsprobe's web extra (docs/deployment.md).",
)
@click.option(
    "--lfs",
    metavar="BIN",
    callback=absolute_lfs,
    help="The lfs binary [env FSPROBE_LFS; default: lfs on PATH].",
)
@click.option(
    "--lctl",
    metavar="BIN",
    callback=absolute_lfs,
    help="The lctl binary, for this node's connection to each Lustre target "
    "[env FSPROBE_LCTL; default: lctl on PATH].",
)
@click.option(
    "--sync-redirected",
    is_flag=True,
    default=None,
    help="Copy checkpoints that fsprobe.save redirected to a fallback directory back to their "
    "target once it is healthy (checksum verified; a newer checkpoint is never overwritten).",
)
@click.option(
    "--once",
    is_flag=True,
    help="Run every probe once, write the state file (and textfile), print one line per "
    "target (status and reasons) and exit with the worst status: 0 ok, 1 degraded, "
    "2 unhealthy, 3 unknown. For cron.",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Log every probe result, not only changes and errors."
)
def run(
    paths: tuple[str, ...],
    config_file: str | None,
    listen: str | None,
    state_dir: str | None,
    textfile_dir: str | None,
    web_config: str | None,
    lfs: str | None,
    lctl: str | None,
    sync_redirected: bool | None,
    once: bool,
    verbose: bool,
) -> int:
    """Watch PATHs (checkpoint directories) in the background and serve what is seen.

    Probes each target on its own interval with ±10 % jitter (statvfs 15 s, test write and
    $TMPDIR 60 s, lfs quota and lfs df 300 s), each bounded by a deadline, so a hung mount is
    reported as stuck instead of hanging the daemon. Serves Prometheus metrics, rewrites the
    state file that `fsprobe status` and the save hook read after every probe, and optionally
    a node_exporter textfile.

    Settings come from the config file, then FSPROBE_* variables, then these flags. SIGHUP
    reloads the config file (a bad one is logged and the running one kept); SIGTERM or SIGINT
    stop within a second. Exit status: 64 for a bad config or usage, 69 when it cannot start
    (address in use, state dir not yours), 70 when its scheduler died of a bug (/metrics
    answered 503 meanwhile; restart it).

    \b
    Examples:
      fsprobe run /lustre/proj/ckpt
      fsprobe run --config /etc/fsprobe.toml --textfile-dir /var/lib/node_exporter
      fsprobe run --once "$CKPT_DIR" || echo "checkpoint dir not ok"
    """
    overrides = configuration.Overrides(
        paths=paths,
        config_file=config_file,
        listen=listen,
        state_dir=state_dir,
        textfile_dir=textfile_dir,
        web_config=web_config,
        lfs=lfs,
        lctl=lctl,
        log_level="debug" if verbose else None,
        sync_redirected=sync_redirected,
    )
    try:
        config = configuration.load(overrides)
    except configuration.ConfigError as error:
        raise _ConfigProblem(str(error)) from None
    level = config.log_level
    if once and not verbose and level == "info":
        level = "warning"  # cron mails whatever a job prints: only problems
    logs.configure(level)
    try:
        if once:
            views = run_once(config)
            for view in views:
                verdict = view.verdict
                click.echo(render_summary(view.path, verdict.status.label, verdict.reasons))
            return int(max((view.verdict.status for view in views), default=Status.UNKNOWN))
        died = Daemon(config, reload=lambda: configuration.load(overrides)).run_until_signalled()
    except StartupError as error:
        raise _CannotStart(str(error)) from None
    return EXIT_SOFTWARE if died else 0
