"""A command group with a default command (the click-default-group pattern, kept small).

``gpuinfra cost STACK [OPTIONS]`` and ``gpuinfra cost diff STACK_A STACK_B [OPTIONS]`` share one
group: click cannot give a group callback a positional argument *and* sub-commands, so the group
sends every command line whose first token is not a visible sub-command's name to a hidden
default command. A stack named like a sub-command (``diff``) is therefore not addressable this
way; :func:`gpuinfra.spec.check_new_stack_name` refuses such names.

Usage::

    class _CostGroup(DefaultCommandGroup):
        default_command = "stack"

    app = typer.Typer(cls=_CostGroup)

    @app.command("stack", hidden=True, cls=DefaultCommand)
    def cost(stack: str = typer.Argument(...), ...): ...
"""

from __future__ import annotations

import copy
from typing import Any

from typer.core import TyperCommand, TyperGroup, _click  # typer's vendored click: the base Context


class _DefaultContext(_click.Context):  # TyperCommand.context_class
    """The default command runs without a name of its own: its command path is the group's."""

    @property
    def command_path(self) -> str:
        """``gpuinfra cost`` (not ``gpuinfra cost `` with the missing name's space)."""
        return super().command_path.rstrip()


class DefaultCommand(TyperCommand):
    """The command class of a :class:`DefaultCommandGroup`'s default command: usage lines and
    error hints name it as the group (``Usage: gpuinfra cost [OPTIONS] STACK``)."""

    context_class = _DefaultContext


class DefaultCommandGroup(TyperGroup):
    """A Typer group that runs :attr:`default_command` unless the first token names a visible
    sub-command; ``--help`` of the group shows the default command's arguments and options,
    then the sub-commands.

    Subclass it and set :attr:`default_command` to the hidden default command's name.
    """

    #: name of the hidden command run when no sub-command is named.
    default_command: str = ""
    #: options before the stack name (``cost --json STACK``) are the default command's to parse.
    ignore_unknown_options = True

    def resolve_command(self, ctx: _click.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """Put the default command's name in front of ``args`` unless ``args[0]`` names a visible
        sub-command (a hidden command's name, e.g. a stack called ``stack``, is data)."""
        named = self.commands.get(args[0]) if args else None
        if args and (named is None or named.hidden):
            args = [self.default_command, *args]
        name, command, rest = super().resolve_command(ctx, args)
        return (None if name == self.default_command else name), command, rest

    def format_help(self, ctx: _click.Context, formatter: Any) -> None:
        """The group's help, with the default command's arguments, options and usage."""
        view = copy.copy(self)
        view.params = list(self.commands[self.default_command].params)
        view.subcommand_metavar = "| COMMAND [ARGS]..."
        return super(DefaultCommandGroup, view).format_help(ctx, formatter)
