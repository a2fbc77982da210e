"""The `fsprobe` command: one click group, one module per subcommand."""

from __future__ import annotations

import click

from fsprobe import __version__
from fsprobe.cli import check, quota, run, status, sync
from fsprobe.cli.exits import EXIT_USAGE


class _Group(click.Group):
    """A click group whose usage errors exit with 64, leaving 0-3 to the health statuses."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            raise SystemExit(130) from None
        except click.UsageError as error:
            error.show()
            raise SystemExit(EXIT_USAGE) from None
        except click.ClickException as error:
            error.show()
            raise SystemExit(error.exit_code) from None
        raise SystemExit(code if isinstance(code, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fsprobe")
def main() -> None:
    """Watch the filesystem under your checkpoints, and keep the training alive when it falters."""


main.add_command(check.check)
main.add_command(quota.quota)
main.add_command(sync.sync)
main.add_command(run.run)
main.add_command(status.status)
