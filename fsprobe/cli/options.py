"""Option types and option groups shared by several subcommands."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import click

from fsprobe.daemon.config import MAX_DEADLINE, MAX_ID, MIN_INTERVAL
from fsprobe.lustre.runner import absolute_binary
from fsprobe.probing.target import check_probe_as
from fsprobe.quota.ids import id_of
from fsprobe.units import parse_size


class SizeType(click.ParamType):
    """``20G``, ``1.5TiB``, ``512M`` → bytes (binary multiples)."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


SIZE = SizeType()


class DirectoryType(click.ParamType):
    """A directory as text. Never stat'ed here, unlike click.Path: the parent process never
    touches a target (on a hung mount the stat would hang the command); the probes, in their
    worker, find out what it is. Only an empty name is refused (it is not the working
    directory)."""

    name = "PATH"

    def convert(self, value, param, ctx):
        if not value:
            self.fail("an empty path names no directory", param, ctx)
        return value


DIRECTORY = DirectoryType()


class SecondsType(click.ParamType):
    """A deadline in seconds: finite, from 0.1 s to an hour.

    click's FloatRange lets ``nan`` through (it compares false with both bounds) and ``inf``
    when there is no maximum; either would reach a timer that cannot take it.
    """

    name = "SECONDS"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not (math.isfinite(seconds) and MIN_INTERVAL <= seconds <= MAX_DEADLINE):
            self.fail(
                f"{value!r} is not between {MIN_INTERVAL:g} and {MAX_DEADLINE:g} seconds",
                param,
                ctx,
            )
        return seconds


SECONDS = SecondsType()


class ProbeAsType(click.ParamType):
    """Who probes: owner, root or an account of this host (name or uid)."""

    name = "probe_as"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):
        try:
            return check_probe_as(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


PROBE_AS = ProbeAsType()


class IdType(click.ParamType):
    """A uid or gid as a number or a name (``alice``, ``1000``); a project ID as a number.

    Names are resolved here, with the system's user and group databases (pwd, grp), as `lfs
    quota -u` would; the probe is given the number, which is also what its output is checked
    against.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind  # user | group | project
        self.name = "ID" if kind == "project" else "NAME|ID"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit() and text.isascii():
            number = int(text)
            if number > MAX_ID:
                self.fail(f"{text} is not a {self.kind} ID (0 to {MAX_ID})", param, ctx)
            return number
        if self.kind == "project":
            self.fail(f"{value!r} is not a project ID: projects are numbers", param, ctx)
        try:
            return id_of(self.kind, text)
        except KeyError:
            self.fail(f"no {self.kind} named {value!r} on this system", param, ctx)


def absolute_lfs(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--lfs ./bin/lfs, made absolute now: the probe worker that runs it works in /."""
    return absolute_binary(value)


def absolute_path(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A directory option given relative, made absolute against the working directory now
    (a child acting for a user, or the probe worker, works elsewhere)."""
    return os.path.abspath(os.path.expanduser(value)) if value else value


def quota_options(command: Callable) -> Callable:
    """--quota-provider, --lfs and the ID overrides, as `check` and `quota` both take them."""
    options = [
        click.option(
            "--quota-provider",
            type=click.Choice(["auto", "lfs", "none"]),
            default="auto",
            show_default=True,
            help="Where quota comes from; auto uses lfs on Lustre mounts only.",
        ),
        click.option(
            "--lfs",
            "lfs",
            metavar="BIN",
            envvar="FSPROBE_LFS",
            callback=absolute_lfs,
            help="The lfs binary [env FSPROBE_LFS; default: lfs on PATH].",
        ),
        click.option(
            "--user",
            type=IdType("user"),
            help="Query this user (name or uid) instead of yourself.",
        ),
        click.option(
            "--group",
            type=IdType("group"),
            help="Query this group (name or gid) instead of the one a new file would get.",
        ),
        click.option(
            "--project",
            type=IdType("project"),
            help="Query this project ID instead of the directory's.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command
