"""The ``gpuinfra`` command line (Typer). One module per command group; each command parses,
calls the library, prints. Exit codes are documented in :mod:`gpuinfra.errors`.
"""

from __future__ import annotations

import os
import sys

import typer

from gpuinfra.errors import ExitCode, GpuinfraError

app = typer.Typer(
    name="gpuinfra",
    help="Plan, price and create GPU training clusters on AWS and GCP as Pulumi stacks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _register() -> None:
    from gpuinfra.cli import catalog, check, cost, image, lifecycle, new, offers, preview, profiles, run, size, status  # noqa: F401  (thin command modules)  # noqa: F401  (image bakes, GPU monitoring status)

    app.command("offers")(offers.offers)
    app.command("new")(new.new)
    app.command("preview")(preview.preview)
    app.command("profiles")(profiles.profiles)
    app.command("size")(size.size)
    from gpuinfra.cli import plan  # the deadline planner (gpuinfra plan)

    app.command("plan")(plan.plan)
    app.command("up")(lifecycle.up)
    app.command("down")(lifecycle.down)
    app.command("ls")(lifecycle.ls)
    app.command("reap")(lifecycle.reap)
    app.command("check")(check.check)
    app.command("status")(status.status)
    app.command("run")(run.run)
    app.command("logs")(run.logs)
    app.command("jobs")(run.jobs_)
    app.command("cancel")(run.cancel)
    app.add_typer(cost.app, name="cost")
    app.add_typer(catalog.app, name="catalog")
    app.add_typer(image.app, name="image")


_register()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning expected errors -- gpuinfra's and the command
    line's own (an unknown option, a missing argument) -- into one ``error:`` line on stderr.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
    """
    try:
        code = app(args=argv, prog_name="gpuinfra", standalone_mode=False)
    except GpuinfraError as exc:
        if os.environ.get("GPUINFRA_DEBUG") == "1":
            raise
        sys.stderr.write("".join(f"error: {line}\n" for line in str(exc).splitlines() or [""]))
        sys.exit(int(exc.exit_code))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # the command line itself: unknown option, missing argument ...
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            sys.stderr.write(ctx.get_help() + "\n")  # a bare group: its help, as before
        else:
            where = ctx.command_path if ctx is not None else "gpuinfra"
            sys.stderr.write(f"error: {exc.format_message()} (see `{where} --help`)\n")
        sys.exit(int(ExitCode.BAD_INPUT))
    except (KeyboardInterrupt, typer.Abort):
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as exc:  # a bug: short message unless debugging
        if os.environ.get("GPUINFRA_DEBUG") == "1":
            raise
        sys.stderr.write(f"internal error: {type(exc).__name__}: {exc} (set GPUINFRA_DEBUG=1 for a traceback)\n")
        sys.exit(int(ExitCode.INTERNAL))
    sys.exit(code if isinstance(code, int) else 0)
