"""`fsprobe quota PATH`: which quota will stop my next checkpoint here, and when?"""

from __future__ import annotations

import json
import time

import click

from fsprobe.cli.options import quota_options
from fsprobe.errors import ProbeFailure, errno_name
from fsprobe.probes.quota import QuotaLookup, locate, lookup_quota
from fsprobe.quota import QuotaSettings
from fsprobe.quota.render import as_json, render

#: Exit status when the quota could not be read (or no provider applies): "unknown", as in
#: the monitoring-plugin convention that `fsprobe check` follows.
EXIT_UNREAD = 3


def _not_applicable(path: str, lookup: QuotaLookup, provider: str) -> str:
    if provider == "none":
        return f"{path}: quota provider is 'none': no quota read"
    fstype = lookup.mount.fstype if lookup.mount is not None else "an unknown filesystem"
    return f"{path} is on {fstype}, not Lustre: no lfs quota; use --quota-provider lfs to force"


@click.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object for scripts.")
@quota_options
def quota(
    path: str,
    json_output: bool,
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
    settings = QuotaSettings(
        provider=quota_provider, lfs=lfs, user=user, group=group, project=project
    )
    _, mount = locate(path)
    mountpoint = mount.mountpoint if mount is not None else None
    try:
        lookup = lookup_quota(path, settings)
    except (OSError, ProbeFailure) as error:
        name = error.error if isinstance(error, ProbeFailure) else errno_name(error.errno)
        text = error.message if isinstance(error, ProbeFailure) else (error.strerror or str(error))
        message = f"cannot read the quota of {path}: {name}: {text}"
        if json_output:
            document = as_json(path, mountpoint, settings.provider, None)
            document["errors"] = [message]
            click.echo(json.dumps(document, indent=2))
        click.echo(f"fsprobe quota: {message}", err=True)
        return EXIT_UNREAD

    if lookup.report is None:
        message = _not_applicable(path, lookup, quota_provider)
        if json_output:
            document = as_json(path, mountpoint, None, None)
            document["errors"] = [message]
            click.echo(json.dumps(document, indent=2))
        click.echo(f"fsprobe quota: {message}", err=True)
        return EXIT_UNREAD

    if json_output:
        click.echo(json.dumps(as_json(path, mountpoint, lookup.provider, lookup.report), indent=2))
    else:
        fstype = mount.fstype if mount is not None else None
        click.echo(render(path, mountpoint, fstype, lookup.report, time.time()))
    for error in lookup.report.errors:
        click.echo(f"fsprobe quota: warning: {error}", err=True)
    return 0
