"""The `krex` command line: one module per subcommand under commands/, each added here (they never import
this module); errors printed in one place."""

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
    """Run many GPU kernel benchmarks at once; only their timed regions get the GPU alone."""


def full() -> click.Group:
    """The group with every subcommand (what `krex --help` and the docs' tests see)."""
    from .commands import controller, run, status, trace

    for command in (controller.controller, run.run, status.status, trace.trace):
        cli.add_command(command)
    return cli


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        # before the heavier imports: a command started during a region stays off the owner's cores
        from . import paths, procs

        procs.early_affinity = procs.step_off_reserved(str(paths.default_socket()))
        from .commands import run  # only what `krex run` needs: it starts with every command
        cli.add_command(run.run)
    else:
        full()

    # usage errors as one line, like every other krex error (click's own shows usage and a hint first)
    try:
        code = cli.main(prog_name="krex", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("krex: aborted", err=True)
        sys.exit(1)
    except click.exceptions.NoArgsIsHelpError as e:   # a bare `krex`: its help, as --help gives it
        click.echo(e.ctx.get_help(), err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        ctx = getattr(e, "ctx", None)
        if ctx is not None and ctx.parent:
            where = f"krex {ctx.info_name}: "
        elif ctx is None and len(sys.argv) > 1 and sys.argv[1] in cli.commands:
            where = f"krex {sys.argv[1]}: "    # the parser's errors (an option's missing value) come without one
        else:
            where = "krex: "
        click.echo(where + e.format_message(), err=True)
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
