"""`fsprobe check PATH`: will my checkpoint fit, and is the filesystem healthy right now?"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import click

from fsprobe.checking import check as run_check
from fsprobe.cli.options import DIRECTORY, PROBE_AS, SECONDS, SIZE, absolute_lfs, quota_options
from fsprobe.cli.render import render_report
from fsprobe.daemon.config import ConfigError, load_target, server_probes_elsewhere
from fsprobe.probing.plan import ProbeSettings


@click.command()
@click.argument("path", type=DIRECTORY)
@click.option("--need", type=SIZE, metavar="SIZE", help="Space the checkpoint needs, e.g. 50G.")
@click.option("--need-inodes", type=click.IntRange(min=0), metavar="N", help="Inodes it needs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object for scripts.")
@click.option(
    "--timeout",
    type=SECONDS,
    metavar="SECONDS",
    help="Deadline for every probe (default 10 s, quota 30 s); a hung mount answers by then.",
)
@click.option("--no-write-probe", is_flag=True, help="Skip the test write (read-only check).")
@click.option("--no-quota", is_flag=True, help="Skip lfs quota and lfs df.")
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help="Judge and probe as `fsprobe run --config FILE` would: its thresholds, deadlines, "
    "write size and quota settings, with PATH's own overrides when the file lists PATH. "
    "The other options refine it.",
)
@click.option(
    "--probe-as",
    type=PROBE_AS,
    metavar="owner|root|USER",
    help="Who probes, when run as root: the directory's owner (default, so that the test "
    "write meets their quota and permissions), root, or this account.",
)
@click.option(
    "--lctl",
    "lctl",
    metavar="BIN",
    envvar="FSPROBE_LCTL",
    callback=absolute_lfs,
    help="The lctl binary, for this node's connection to each Lustre target "
    "[env FSPROBE_LCTL; default: lctl on PATH].",
)
@quota_options
def check(
    path: str,
    need: int | None,
    need_inodes: int | None,
    as_json: bool,
    timeout: float | None,
    no_write_probe: bool,
    no_quota: bool,
    config_file: str | None,
    quota_provider: str,
    lfs: str | None,
    lctl: str | None,
    user: int | None,
    group: int | None,
    project: int | None,
    probe_as: str | None,
) -> int:
    """Probe PATH once and say whether a checkpoint can be written there now.

    Runs statvfs, lfs quota and lfs df (on Lustre), a real 1 MiB atomic test save and a
    $TMPDIR check, each bounded by a deadline. PATH may not exist yet: its nearest existing
    parent is probed.

    \b
    Exit status: 0 ok, 1 degraded, 2 unhealthy, 3 unknown, 64 usage error.

    \b
    Examples:
      fsprobe check /lustre/proj/ckpt --need 50G
      fsprobe check "$CKPT_DIR" --need 120G --json | jq .headroom
      fsprobe check /lustre/proj/ckpt --config /etc/fsprobe/fsprobe.toml
    """
    settings, elsewhere = ProbeSettings(), None
    if config_file:
        try:
            target = load_target(config_file, path)
        except ConfigError as error:
            raise click.UsageError(str(error)) from None
        settings, elsewhere = target.settings, target.server_probes_elsewhere
    elif quota_provider == "auto":
        elsewhere = server_probes_elsewhere("auto", os.environ)
    if elsewhere is not None and quota_provider == "auto" and not no_quota:
        # One rank of a job asks the servers for all (docs/design.md §8); --quota-provider lfs asks.
        click.echo(f"fsprobe check: lfs quota and lfs df not asked here: {elsewhere}", err=True)
        no_quota = True
    server = settings.server_probes
    if no_quota or quota_provider != "auto":
        server = dataclasses.replace(server, provider="none" if no_quota else quota_provider)
    settings = dataclasses.replace(
        settings,
        write_probe=settings.write_probe and not no_write_probe,
        probe_as=probe_as or settings.probe_as,
        server_probes=dataclasses.replace(
            server,
            lfs=lfs or server.lfs,
            lctl=lctl or server.lctl,
            user=server.user if user is None else user,
            group=server.group if group is None else group,
            project=server.project if project is None else project,
        ),
    )
    report = run_check(path, settings, need_bytes=need, need_inodes=need_inodes, timeout=timeout)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(render_report(report, time.time()))
    return int(report.status)
