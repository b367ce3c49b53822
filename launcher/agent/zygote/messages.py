"""What the agent and the zygote say to each other: the zygote's command line and the socket messages.

Each is a typed record, encoded in one place and decoded once where it arrives (marshal: no code,
no classes, only the builtin values the two interpreters of the same Python share).
"""

from __future__ import annotations

import marshal
from dataclasses import asdict, dataclass, field

from ..quick_exit import RETURNED_SUFFIX  # noqa: F401  # re-exported: the agent's name for the marker

ENTRY = "launcher.agent.zygote"  # `python -m launcher.agent.zygote`: also how tests and sweeps tell the zygote in ps


@dataclass(frozen=True)
class ZygoteArgs:
    """The zygote's command line: its end of the socket, the agent's pid, the modules to import."""

    sock_fd: int
    agent: int
    modules: tuple[str, ...]

    def argv(self, python: str) -> list[str]:
        return [python, "-m", ENTRY, str(self.sock_fd), str(self.agent), *self.modules]

    @classmethod
    def parse(cls, argv: list[str]) -> ZygoteArgs:
        """`sys.argv` of `python -m launcher.agent.zygote FD AGENT MODULE…` (argv[0] is the module's path)."""
        return cls(sock_fd=int(argv[1]), agent=int(argv[2]), modules=tuple(argv[3:]))


@dataclass(frozen=True)
class Program:
    """What a forked worker runs, decided once in the agent: a script (or folder, zip) or `-m module`."""

    target: str  # the script's path as typed, or the module's name
    module: bool


@dataclass(frozen=True)
class ForkRequest:
    """One worker to fork: what it runs, its arguments, environment, working directory and CPUs."""

    program: Program
    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    cpus: tuple[int, ...] = ()  # --numa_binding: the CPUs it runs on (empty: the zygote's)

    def encode(self) -> bytes:
        return marshal.dumps((self.program.target, self.program.module, self.args, self.env, self.cwd, self.cpus))

    @classmethod
    def decode(cls, data: bytes) -> ForkRequest:
        target, module, args, env, cwd, cpus = marshal.loads(data)
        return cls(Program(target, module), tuple(args), env, cwd, tuple(cpus))


@dataclass(frozen=True)
class Reply:
    """The zygote's answer: ready (`seconds` of imports), forked (`pid`), or an `error` in one line."""

    error: str = ""
    seconds: float | None = None
    pid: int | None = None

    def encode(self) -> bytes:
        return marshal.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> Reply:
        return cls(**marshal.loads(data))


@dataclass
class Job:
    """In a forked worker: its request, the stdio it was handed, and what it needs to become a worker."""

    request: ForkRequest
    fds: list[int] = field(default_factory=list)  # stdout, stderr, and stdin when the agent had one
    agent: int = 0  # the agent's pid: the worker's parent once the middle process has exited
    comm: str = ""  # the interpreter's process name, which the worker takes back from "launcher-zygote"
