"""Option types and option groups shared by several subcommands."""

from __future__ import annotations

import math
from collections.abc import Callable

import click

from fsprobe.daemon.config import MAX_DEADLINE, MIN_INTERVAL
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
            help="The lfs binary [env FSPROBE_LFS; default: lfs on PATH].",
        ),
        click.option(
            "--user",
            type=click.IntRange(min=0),
            metavar="ID",
            help="Query this uid instead of yours.",
        ),
        click.option(
            "--group",
            type=click.IntRange(min=0),
            metavar="ID",
            help="Query this gid instead of the one a new file would get.",
        ),
        click.option(
            "--project",
            type=click.IntRange(min=0),
            metavar="ID",
            help="Query this project ID instead of the directory's.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command
