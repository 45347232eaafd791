"""The `krex` command line: one module per subcommand under commands/; errors printed in one place."""

import sys

import click

from . import __version__
from .errors import KrexCommandError, KrexError


class KrexGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KrexCommandError as e:
            click.echo(f"krex: {e}", err=True)
            sys.exit(e.exit_code)
        except KrexError as e:
            click.echo(f"krex: {e}", err=True)
            sys.exit(1)


@click.group(cls=KrexGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="krex")
def cli() -> None:
    """Run many GPU kernel benchmarks at once without corrupting a single measurement."""


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        # before the heavier imports: a command started during a region stays off the owner's cores
        from . import paths, procs

        procs.early_affinity = procs.step_off_reserved(str(paths.default_socket()) + ".reserved")
        from .commands import run  # noqa: F401  (only what `krex run` needs: it starts with every command)
    else:
        from .commands import controller, run, status  # noqa: F401  (registers the subcommands)

    cli(prog_name="krex")
