"""The node's files and systemd units as typed records, and the node paths they use.

One :class:`SystemdUnit` type serves every unit a GPU node runs, whether the boot text writes it
(agent, scratch, cluster-env, bundle fetch, pre-pull) or the node bundle does (health gate,
training image build, fabric host stack, RxDM, monitoring agent). A unit becomes unit-file text
in one place, :meth:`SystemdUnit.render`, following systemd.unit(5)
(https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html) and
systemd.service(5) (https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html).

Everything that reaches a unit file is checked when the record is built: unit names, absolute
paths without control characters, no newline or NUL in any value. Command lines are argument
vectors (:class:`ExecCommand`), quoted by systemd's own rules (:func:`systemd_quote`), so a
value is always one argument.

Pure Python, no Pulumi imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpuinfra.errors import UnitValueError
from gpuinfra.health import node as health_node

# ------------------------------------------------------------------------------ node paths
#: systemd's folder for units an administrator installs (systemd.unit(5), "Unit File Load Path").
UNIT_DIR = "/etc/systemd/system"
#: gpuinfra's configuration folder on the node.
ETC_DIR = str(health_node.NODE_ENV_PATH.parent)
#: The node agent's settings (:data:`gpuinfra.agent.node.NODE_ENV_KEYS`).
NODE_ENV_PATH = str(health_node.NODE_ENV_PATH)
#: torchrun's rendezvous settings, written by ``gpuinfra-cluster-env`` once the peers are known.
CLUSTER_ENV_PATH = str(health_node.CLUSTER_ENV_PATH)
#: The ranked nodes' addresses, written with :data:`CLUSTER_ENV_PATH`.
HOSTFILE_PATH = str(health_node.HOSTFILE_PATH)
#: NCCL / fabric environment of the node (read by ``gpuinfra-run`` and login shells).
NCCL_ENV_PATH = f"{ETC_DIR}/nccl.env"
#: Run-time state (tmpfs, empty after every boot): health marks, scratch failure note.
RUN_DIR = str(health_node.STATE_DIR)
#: Written by the scratch script when it cannot build the RAID0 (one line: why).
SCRATCH_FAILED_PATH = f"{RUN_DIR}/scratch-failed"
#: Where gpuinfra's own programs go.
SBIN_DIR = "/usr/local/sbin"
NODE_LIB = health_node.NODE_LIB

#: systemd unit names gpuinfra writes or orders against: ``name.service`` / ``name.timer`` /
#: ``name.target`` (systemd.unit(5), "Description": unit names are ``[a-zA-Z0-9:_.\\-@]`` plus
#: a type suffix; gpuinfra uses a subset without ``:`` and ``\\``).
UNIT_NAME_RE = re.compile(r"[a-zA-Z0-9@._-]+\.(service|timer|target|mount)")
_WRITABLE_UNIT_RE = re.compile(r"[a-zA-Z0-9@._-]+\.(service|timer)")
#: Characters that need no quotes in a command-line word (no quotes, no ``$``, no backslash, no
#: whitespace, no ``;``; ``%`` is still doubled).
_PLAIN_WORD_RE = re.compile(r"[A-Za-z0-9_@%+=:,./^~!|&<>*?()\[\]{}#-]+")


def check_value(what: str, value: str) -> str:
    """``value`` if it is one line of printable characters (tabs allowed): a unit-file setting is
    one line, and YAML (cloud-config) also breaks lines at U+0085, U+2028 and U+2029
    (https://yaml.org/spec/1.2.2/#54-line-break-characters; PyYAML treats them as line breaks), so
    those and every other control or separator character are refused.

    Raises:
        UnitValueError: a line break, NUL or other non-printable character in ``value``.
    """
    if any(not (c.isprintable() or c == "\t") for c in value):
        raise UnitValueError(f"{what} {value!r} has a line break or control character; a setting is one line")
    return value


def _setting_text(what: str, text: str) -> str:
    """Free text for a unit setting: one printable line, ``%`` doubled (specifiers are resolved in
    it), never ending in ``\\`` (a trailing backslash continues the line; systemd.syntax(7)).

    Raises:
        UnitValueError: a line break, control character or trailing backslash.
    """
    check_value(what, text)
    if text.endswith("\\"):
        raise UnitValueError(f"{what} {text!r} ends in a backslash, which would continue the setting")
    return text.replace("%", "%%")


def check_path(path: str) -> str:
    """``path`` if it is absolute, normalised and has no whitespace or control characters.

    Raises:
        UnitValueError: otherwise.
    """
    if (
        not path.startswith("/")
        or "//" in path
        or "/../" in path
        or path.endswith("/..")
        or any(c.isspace() or ord(c) < 32 or c in "'\"\\$`" for c in path)
    ):
        raise UnitValueError(f"node path {path!r} must be absolute, without '..', quotes, '$' or whitespace")
    return path


def check_unit_name(name: str, writable: bool = False) -> str:
    """``name`` if it is a unit name (``writable``: one gpuinfra may write, ``.service`` or
    ``.timer``; else ``.target`` and ``.mount`` too, for ordering).

    Raises:
        UnitValueError: otherwise.
    """
    if not (_WRITABLE_UNIT_RE if writable else UNIT_NAME_RE).fullmatch(name):
        raise UnitValueError(f"{name!r} is not a unit name (letters, digits, '@._-', then .service or .timer)")
    return name


def systemd_quote(word: str, *, variables: bool = True) -> str:
    """One command-line word in systemd's syntax (systemd.service(5), "Command lines",
    https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html#Command%20lines;
    systemd.syntax(7), "Quoting", https://www.freedesktop.org/software/systemd/man/latest/systemd.syntax.html):
    ``%`` is a specifier and is written ``%%``; ``$`` starts a variable and is written ``$$``.
    A word with characters other than :data:`_PLAIN_WORD_RE`'s is quoted: in single quotes when
    it holds neither ``'`` nor ``\\`` (nothing inside needs an escape), else in double quotes with
    ``\\`` and ``"`` escaped C-style. An empty word is ``''``.

    ``variables=False`` is for settings where ``$`` has no meaning (``Environment=``,
    systemd.exec(5): "variable expansion is not performed"): ``$`` is then written as it is.

    Raises:
        UnitValueError: a line break or other non-printable character in ``word``.
    """
    check_value("command word", word)
    escaped = word.replace("%", "%%")
    if variables:
        escaped = escaped.replace("$", "$$")
    if _PLAIN_WORD_RE.fullmatch(word):
        return escaped
    if "'" not in word and "\\" not in word:
        return f"'{escaped}'"
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class ExecCommand:
    """One ``Exec*=`` command line: ``argv`` (the program's absolute path first) and an optional
    systemd prefix (``-``: a failure is ignored; systemd.service(5), "Command lines").

    Raises:
        UnitValueError: an empty ``argv``, a relative program path or a newline/NUL in a word.
    """

    argv: tuple[str, ...]
    prefix: Literal["", "-"] = ""

    def __post_init__(self) -> None:
        if not self.argv:
            raise UnitValueError("a command needs a program")
        check_path(self.argv[0])
        for word in self.argv:
            check_value("command word", word)

    def render(self) -> str:
        """The command as the value of an ``Exec*=`` setting."""
        return self.prefix + " ".join(systemd_quote(w) for w in self.argv)


def command(*argv: str, ignore_failure: bool = False) -> ExecCommand:
    """:class:`ExecCommand` of ``argv`` (``ignore_failure``: the ``-`` prefix)."""
    return ExecCommand(tuple(argv), "-" if ignore_failure else "")


def shell(script: str, *args: str) -> ExecCommand:
    """``/bin/sh -c script sh args...``: the shell script gets ``args`` as ``$1``... -- values
    reach the script as arguments, never as script text (sh(1p), ``-c``: the first operand after
    the script is ``$0``)."""
    return ExecCommand(("/bin/sh", "-c", script, *(("sh", *args) if args else ())))


@dataclass(frozen=True)
class NodeFile:
    """One file a node gets.

    Attributes:
        path: absolute path (checked by :func:`check_path`).
        mode: octal permission text, ``0644`` or ``0755``.
        content: the text; a final newline is added when missing.

    Raises:
        UnitValueError: a bad path or mode.
    """

    path: str
    mode: str = "0644"
    content: str = ""

    def __post_init__(self) -> None:
        check_path(self.path)
        if not re.fullmatch(r"0[0-7]{3}", self.mode):
            raise UnitValueError(f"{self.path}: mode {self.mode!r} is not octal like 0644")
        if "\0" in self.content:
            raise UnitValueError(f"{self.path}: content has a NUL byte")
        if not self.content.endswith("\n"):
            object.__setattr__(self, "content", self.content + "\n")


StartMode = Literal["block", "no-block", "none"]


@dataclass(frozen=True)
class SystemdUnit:
    """A systemd service (or timer) unit and how a node starts it.

    Attributes (unit-file settings; an empty tuple or None leaves the setting out):
        name: ``gpuinfra-agent.service`` (:func:`check_unit_name`).
        description: ``Description=``.
        after / before / wants / requires: ordering and dependencies (systemd.unit(5)); every
            entry is a unit name.
        default_dependencies: False writes ``DefaultDependencies=no`` (early-boot units).
        start_limit_interval_sec / start_limit_burst: ``StartLimitIntervalSec=`` (0: no rate
            limit on restarts) / ``StartLimitBurst=``.
        type: ``Type=`` (``simple`` is systemd's default and is not written).
        remain_after_exit: ``RemainAfterExit=yes`` (a oneshot counts as active once done).
        timeout_start_sec: ``TimeoutStartSec=``, seconds or ``infinity``.
        environment: ``Environment=`` pairs; environment_file: ``EnvironmentFile=`` paths.
        exec_condition / exec_start_pre / exec_start / exec_start_post / exec_stop: commands.
        restart: ``Restart=`` (``no`` is the default and is not written); restart_sec:
            ``RestartSec=`` seconds.
        timeout_stop_sec / kill_mode: ``TimeoutStopSec=`` / ``KillMode=`` where relevant.
        wanted_by: ``WantedBy=`` targets ([Install]).
        start: how the node starts it: ``block`` (``systemctl enable --now``, the boot waits),
            ``no-block`` (``--no-block``: queued, the boot goes on), ``none`` (another unit or
            script starts it, e.g. RxDM by the fabric host script).
        delivery: ``boot`` (the boot text writes it) or ``bundle`` (the node bundle does).
        status_file: a file the unit writes when it fails (the GCP boot prints it).

    Raises:
        UnitValueError: a bad name, a newline/NUL in a value, a relative path.
    """

    name: str
    description: str
    after: tuple[str, ...] = ()
    wants: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    default_dependencies: bool = True
    start_limit_interval_sec: int | None = None
    start_limit_burst: int | None = None
    type: Literal["simple", "oneshot"] = "simple"
    remain_after_exit: bool = False
    timeout_start_sec: int | Literal["infinity"] | None = None
    environment: tuple[tuple[str, str], ...] = ()
    environment_file: tuple[str, ...] = ()
    exec_condition: tuple[ExecCommand, ...] = ()
    exec_start_pre: tuple[ExecCommand, ...] = ()
    exec_start: tuple[ExecCommand, ...] = ()
    exec_start_post: tuple[ExecCommand, ...] = ()
    exec_stop: tuple[ExecCommand, ...] = ()
    restart: Literal["no", "on-failure", "always"] = "no"
    restart_sec: int | None = None
    timeout_stop_sec: int | None = None
    kill_mode: Literal["control-group", "mixed", "process", "none"] | None = None
    wanted_by: tuple[str, ...] = ("multi-user.target",)
    start: StartMode = "no-block"
    delivery: Literal["boot", "bundle"] = "boot"
    status_file: str = ""

    def __post_init__(self) -> None:
        check_unit_name(self.name, writable=True)
        check_value("Description", self.description)
        for name in (*self.after, *self.wants, *self.requires, *self.before, *self.wanted_by):
            check_unit_name(name)
        for key, value in self.environment:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise UnitValueError(f"{self.name}: environment name {key!r} is not a variable name")
            check_value(f"{self.name} {key}", value)
        for path in (*self.environment_file, *((self.status_file,) if self.status_file else ())):
            check_path(path)
        if self.type != "oneshot" and len(self.exec_start) != 1:
            raise UnitValueError(f"{self.name}: only a oneshot unit may have {len(self.exec_start)} ExecStart lines")

    @property
    def path(self) -> str:
        """Where the unit file goes: ``/etc/systemd/system/<name>``."""
        return f"{UNIT_DIR}/{self.name}"

    def render(self) -> str:
        """The unit file's text (sections [Unit], [Service], [Install]; one setting a line)."""
        lines = ["[Unit]", f"Description={_setting_text('Description', self.description)}"]
        if not self.default_dependencies:
            lines.append("DefaultDependencies=no")
        for key, names in (
            ("Wants", self.wants),
            ("Requires", self.requires),
            ("After", self.after),
            ("Before", self.before),
        ):
            if names:
                lines.append(f"{key}={' '.join(names)}")
        if self.start_limit_interval_sec is not None:
            lines.append(f"StartLimitIntervalSec={self.start_limit_interval_sec}")
        if self.start_limit_burst is not None:
            lines.append(f"StartLimitBurst={self.start_limit_burst}")
        lines.append("[Service]")
        if self.type != "simple":
            lines.append(f"Type={self.type}")
        if self.remain_after_exit:
            lines.append("RemainAfterExit=yes")
        if self.timeout_start_sec is not None:
            lines.append(f"TimeoutStartSec={self.timeout_start_sec}")
        # Environment= takes quoted "KEY=value" words (systemd.exec(5), "Environment=")
        lines += [f"Environment={systemd_quote(f'{k}={v}', variables=False)}" for k, v in self.environment]
        lines += [f"EnvironmentFile={check_path(p).replace('%', '%%')}" for p in self.environment_file]
        for key, commands in (
            ("ExecCondition", self.exec_condition),
            ("ExecStartPre", self.exec_start_pre),
            ("ExecStart", self.exec_start),
            ("ExecStartPost", self.exec_start_post),
            ("ExecStop", self.exec_stop),
        ):
            lines += [f"{key}={c.render()}" for c in commands]
        if self.restart != "no":
            lines.append(f"Restart={self.restart}")
        if self.restart_sec is not None:
            lines.append(f"RestartSec={self.restart_sec}")
        if self.timeout_stop_sec is not None:
            lines.append(f"TimeoutStopSec={self.timeout_stop_sec}")
        if self.kill_mode is not None:
            lines.append(f"KillMode={self.kill_mode}")
        if self.wanted_by:
            lines += ["[Install]", f"WantedBy={' '.join(self.wanted_by)}"]
        return "\n".join(lines) + "\n"

    def file(self) -> NodeFile:
        """The unit as a :class:`NodeFile` at :attr:`path`."""
        return NodeFile(self.path, "0644", self.render())
