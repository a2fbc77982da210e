"""`fsprobe quota PATH`: which quota will stop my next checkpoint here, and when?"""

from __future__ import annotations

import json
import os
import time

import click

from fsprobe.cli.options import DIRECTORY, SECONDS, quota_options
from fsprobe.cli.render_quota import as_json, render
from fsprobe.model import ProbeResult
from fsprobe.posix.paths import escaped
from fsprobe.probing.plan import LFS_KILL_SLACK
from fsprobe.probing.quota import QuotaLookup
from fsprobe.probing.runner import ProbeCall, ProbeRunner
from fsprobe.probing.worker import ProcessExecutor
from fsprobe.quota import ServerProbeSettings

#: Exit status when the quota could not be read (or no provider applies): "unknown", as in
#: the monitoring-plugin convention that `fsprobe check` follows.
EXIT_UNREAD = 3


def _lookup_in_worker(path: str, settings: ServerProbeSettings) -> ProbeResult:
    """The lookup, made in a worker process: finding the mount and the directory's IDs stats
    and ioctls PATH, which on a hung mount would hang this command for good. The worker is
    this invocation's own, started with this environment (FSPROBE_LFS and the like)."""
    executor = ProcessExecutor()
    try:
        run = ProbeRunner(executor).submit(
            os.path.abspath(path),
            "quota",
            ProbeCall("quota_lookup", (path, settings)),
            settings.timeout + LFS_KILL_SLACK,
        )
        return run.result()
    finally:
        executor.close()


def _not_applicable(path: str, lookup: QuotaLookup, provider: str) -> str:
    if provider == "none":
        return f"{path}: quota provider is 'none': no quota read"
    fstype = lookup.mount.fstype if lookup.mount is not None else "an unknown filesystem"
    return f"{path} is on {fstype}, not Lustre: no lfs quota; use --quota-provider lfs to force"


@click.command()
@click.argument("path", type=DIRECTORY)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object for scripts.")
@click.option(
    "--timeout",
    type=SECONDS,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Deadline for lfs (its process group is killed after it) and for a hung mount.",
)
@quota_options
def quota(
    path: str,
    json_output: bool,
    timeout: float,
    quota_provider: str,
    lfs: str | None,
    user: int | None,
    group: int | None,
    project: int | None,
) -> int:
    """Show the quota that new files in PATH are charged to: user, group and project.

    On Lustre it runs `lfs quota` for your effective uid, the group a new file gets (the
    directory's if it is set-group-ID) and the directory's project ID, and says which limit
    the next write will hit. PATH may not exist yet: its nearest existing parent is used.

    \b
    Exit status: 0 quota read (warnings, if any, on stderr), 3 quota not read (lfs missing or
    failing, not Lustre, permission denied, timeout), 64 usage error.

    \b
    Examples:
      fsprobe quota /lustre/project/ckpt
      fsprobe quota /lustre/project/ckpt --project 4242 --json | jq '.quota[].inodes'
    """
    settings = ServerProbeSettings(
        provider=quota_provider, lfs=lfs, user=user, group=group, project=project, timeout=timeout
    )
    result = _lookup_in_worker(path, settings)
    if not result.ok:
        message = f"cannot read the quota of {path}: {result.error}: {result.message}"
        if json_output:
            document = as_json(path, None, settings.provider, None)
            document["errors"] = [message]
            click.echo(json.dumps(document, indent=2))
        click.echo(f"fsprobe quota: {escaped(message)}", err=True)
        return EXIT_UNREAD
    lookup: QuotaLookup | None = result.value
    assert lookup is not None  # a result that succeeded holds its value
    mount = lookup.mount
    mountpoint = mount.mountpoint if mount is not None else None

    if lookup.report is None:
        message = _not_applicable(path, lookup, quota_provider)
        if json_output:
            document = as_json(path, mountpoint, None, None)
            document["errors"] = [message]
            click.echo(json.dumps(document, indent=2))
        click.echo(f"fsprobe quota: {escaped(message)}", err=True)
        return EXIT_UNREAD

    if json_output:
        click.echo(json.dumps(as_json(path, mountpoint, lookup.provider, lookup.report), indent=2))
    else:
        fstype = mount.fstype if mount is not None else None
        click.echo(render(path, mountpoint, fstype, lookup.report, time.time()))
    for error in lookup.report.errors:
        click.echo(f"fsprobe quota: warning: {escaped(str(error))}", err=True)
    return 0
