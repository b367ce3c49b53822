"""Console output: worker lines from pipes to the console and per-rank files, and the handler that
prints the launcher's own `logging` records as `launcher: ...` lines between them.

Pipes, not polled files: a line reaches the console as soon as the worker writes it, lines
from different ranks never interleave mid-line, and a rank hidden from the console by
`--local_ranks_filter` or `--redirects` still has all of its output in its file.

Every module logs to `logging.getLogger(__name__)` (children of the `launcher` logger); only
`configure_console`, called once by the composition root, attaches a handler to it.
"""

from __future__ import annotations

import logging
import os
import selectors
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import IO

    from ..config import Std
    from ..spec import Worker

CONSOLE_LOCK = threading.Lock()  # every write to the agent's console goes under it
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
log = logging.getLogger(__name__)


class Console:
    """Where the agent's console output goes: worker lines and the launcher's own lines.

    Made by the composition root; the live view swaps the sinks so lines print above its table.
    """

    def __init__(self, stdout: IO[bytes] | None = None, stderr: IO[bytes] | None = None):
        self.stdout: IO[bytes] = stdout or sys.stdout.buffer
        self.stderr: IO[bytes] = stderr or sys.stderr.buffer

    def stream(self, name: str) -> IO[bytes]:
        return self.stdout if name == "stdout" else self.stderr


class ConsoleHandler(logging.Handler):
    """The launcher's records on the console's stderr, one `launcher: ` line each (a timestamp first
    off a terminal, for Slurm and journald), never interleaved with worker lines."""

    def __init__(self, console: Console, timestamps: bool):
        super().__init__()
        self.console, self.timestamps = console, timestamps

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno < logging.INFO:
            text = f"debug ({record.name}): {text}"
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
        except Exception:
            self.handleError(record)
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S ", time.localtime(record.created)) if self.timestamps else ""
        data = "".join(f"{stamp}launcher: {line}\n" for line in message.splitlines()).encode()
        with CONSOLE_LOCK:
            try:
                self.console.stderr.write(data)
                self.console.stderr.flush()
            except (OSError, ValueError):
                pass


def configure_console(console: Console, level: str = "info", quiet: bool = False, timestamps: bool = False) -> None:
    """Send the `launcher` logger's records to `console`: `level` and up, where `--quiet` turns the
    default `info` (the launcher's notes) into `warning` (errors and the failure summary only)."""
    root = logging.getLogger("launcher")
    for old in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(old)
    number = LEVELS[level]
    root.setLevel(logging.WARNING if quiet and number == logging.INFO else number)
    root.addHandler(ConsoleHandler(console, timestamps))
    root.propagate = False


MAX_LINE = 1 << 16  # a longer run without a newline (a progress bar) is cut into lines


@dataclass(eq=False)
class Stream:
    """One worker pipe and where its lines go."""

    fd: int
    prefix: bytes
    console: IO[bytes] | None
    file: IO[bytes] | None
    path: str | None = None
    name: str = ""  # "stdout" or "stderr" (a worker's), "" otherwise
    last_line: str = ""
    last_at: float = 0.0
    partial: bytes = b""
    done: threading.Event = field(default_factory=threading.Event)
    pipe: IO[bytes] | None = None  # the Popen file object: it owns `fd`, closed once we reach its end
    filtered: IO[bytes] | None = None  # --duplicate_std*_filters: lines holding a needle also go here
    needles: tuple[bytes, ...] = ()
    torch_prefix: bytes = b""  # "[rankN]: ", what torch's excepthook puts on this worker's traceback lines
    rank: int | None = None  # the worker's global rank
    held: list[bytes] | None = None  # a traceback kept from the console until it is judged (see `_hold`)
    held_at: float = 0.0  # when its last line came (or, once the pipe ended, when it ended)
    ended: bool = False  # the pipe reached its end
    keep: str | None = None  # where a collateral traceback goes when the stream has no file of its own


# A worker's traceback on stderr is kept from the console until it is known whether it is the failure
# the group stops for or the collateral of it (a peer lost: gloo's "Connection reset by peer", thirteen
# lines as loud as the root cause, printed before it). Collateral, once the worker has exited: one line,
# its exception, after the launcher's line about the root cause; the whole traceback is in its log file
# (or, where its stderr has none, in `keep`). Anything else is printed whole, as it came.
TRACEBACK = b"Traceback (most recent call last):"
QUIET = 0.5  # s without a line that end the traceback of a worker still running: printed whole then
AFTER_EXIT = 1.0  # s an exited worker's traceback waits for the launcher to name the failure it stops for
MAX_HELD = 2000  # lines: more is no traceback, printed as it comes
PUMP_BACKOFF = 0.1  # s between the pump's turns while each of them fails


class LogRouter:
    """Owns the pump thread; `add` a pipe, `drain` before reporting, `close` at the end. `failed_first`
    names the failure the group stops for (the supervisor's), `new_round` forgets it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._pending: list[Stream] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closing = False
        self._disk_errors: set[int] = set()  # errnos already reported: one line each, not one per write
        self._shared: dict[str, IO[bytes]] = {}  # files several streams write (filtered_stdout.log), by path
        self.root: tuple[int, str] | None = None  # (rank, what) the group stops for; rank -1: on another node
        self._holding: list[Stream] = []  # streams with a traceback held (their pipes may have ended): the pump's
        self._thread = threading.Thread(target=self._pump, name="launcher-logs", daemon=True)
        self._thread.start()

    def add(
        self,
        pipe: IO[bytes],
        prefix: str,
        console: IO[bytes] | None,
        path: str | None,
        rank: int | None = None,
        filtered: str | None = None,
        needles: tuple[str, ...] = (),
        name: str = "",
        keep: str | None = None,
    ) -> Stream:
        """Route `pipe` to `console` (with `prefix`) and to the file at `path`, either optional;
        `rank`'s own "[rankN]: " prefix (torch's, on a traceback) is replaced by ours, not doubled.
        Lines holding one of `needles` also go, prefixed, to the file at `filtered` (shared by the
        streams that name it)."""
        file = self._open(path) if path else None
        shared = None
        if filtered and needles:
            with self._lock:
                shared = self._shared.get(filtered)
                if shared is None:
                    shared = self._shared[filtered] = self._open(filtered)  # type: ignore[assignment]
        torch_prefix = b"" if rank is None else b"[rank%d]: " % rank
        stream = Stream(
            pipe.fileno(),
            prefix.encode(),
            console,
            file,
            path,
            name=name,
            pipe=pipe,
            torch_prefix=torch_prefix,
            rank=rank,
            keep=keep,
        )
        stream.filtered, stream.needles = shared, tuple(n.encode() for n in needles)
        with self._lock:
            self._pending.append(stream)
        self._wake()
        return stream

    def failed_first(self, rank: int, what: str) -> None:
        """The group stops for rank `rank`'s failure (`what`: "killed by SIGKILL"; -1: another node's)."""
        if self.root is None:
            self.root = (rank, what)
        self._wake()

    def new_round(self) -> None:
        """A new round's workers start: no failure is the one their group stops for."""
        self.root = None

    def _open(self, path: str) -> IO[bytes] | None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return open(path, "ab", buffering=0)
        except OSError as e:  # read-only or full: the worker runs anyway, its console output too
            self.disk_error(path, e)
            return None

    def disk_error(self, path: str, e: OSError) -> None:
        """Say once per kind of error that log files cannot be written; the job never stops for it."""
        if e.errno in self._disk_errors:
            return
        self._disk_errors.add(e.errno)  # type: ignore[arg-type]
        log.warning(
            f"cannot write {path}: {e.strerror or e}; the job goes on, but log files "
            "may miss output from now on (the console still gets it unless redirected)"
        )

    def drain(self, streams: list[Stream], timeout: float) -> bool:
        """Wait until every stream reached end of file; False if some writer kept a pipe open."""
        deadline = self._clock() + timeout
        for s in streams:
            if not s.done.wait(max(0.0, deadline - self._clock())):
                return False
        return True

    def close(self, timeout: float = 1.0) -> None:
        """Flush what is buffered and stop the thread; pipes still open are cut."""
        self._closing = True
        self._wake()
        self._thread.join(timeout)
        with self._lock:
            shared, self._shared = list(self._shared.values()), {}
        for f in shared:
            try:
                f.close()
            except OSError as e:
                log.debug("closing a filtered log: %s", e)

    # ------------------------------------------------------------------ the thread

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _pump(self) -> None:
        streams: dict[int, Stream] = {}
        failed = 0
        while True:
            try:
                if not self._turn(streams):
                    return
                failed = 0
            except Exception:
                # A bug here must not silently end every worker's output for the rest of the job (and
                # block workers on full pipes): say it with its trace once, and go on pumping.
                if not failed:
                    log.exception("relaying worker output failed (a launcher bug); going on")
                failed += 1
                if failed > 1:  # it fails turn after turn: no busy loop
                    time.sleep(PUMP_BACKOFF)

    def _turn(self, streams: dict[int, Stream]) -> bool:
        """One turn of the pump: take new pipes, judge held tracebacks, move what is readable. False: closed."""
        with self._lock:
            pending, self._pending = self._pending, []
        for s in pending:
            streams[s.fd] = s
            self._selector.register(s.fd, selectors.EVENT_READ, s)
        if self._closing:
            for s in list(streams.values()):
                self._read(s)  # whatever is already in the pipe
                self._finish(s)
            for s in list(self._holding):
                self._release(s, whole=True)
            return False
        self._judge_held()
        wait = min((AFTER_EXIT if s.ended else QUIET) for s in self._holding) if self._holding else None
        for key, _ in self._selector.select(wait / 4 if wait else None):
            if key.data is None:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            stream = key.data
            if not self._read(stream):
                self._finish(stream)
                del streams[stream.fd]
        return True

    def _read(self, s: Stream) -> bool:
        """Move one chunk; False at end of file."""
        try:
            os.set_blocking(s.fd, False)
            chunk = os.read(s.fd, 1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        if s.file:
            try:
                s.file.write(chunk)
            except OSError as e:  # disk full or read-only: keep the console going, keep the job running
                s.file = None
                self.disk_error(s.path or "a log file", e)
        data = s.partial + chunk
        lines = data.split(b"\n")
        s.partial = lines.pop()
        if len(s.partial) > MAX_LINE:
            lines.append(s.partial)
            s.partial = b""
        if lines:
            self._emit(s, lines)
            if s.filtered is not None:
                self._duplicate(s, lines)
        return True

    def _duplicate(self, s: Stream, lines: list[bytes]) -> None:
        picked = b"".join(_prefixed(s, line) + b"\n" for line in lines if any(n in line for n in s.needles))
        if picked:
            try:
                s.filtered.write(picked)  # type: ignore[union-attr]
            except OSError as e:
                s.filtered = None
                self.disk_error("a filtered log", e)

    def _finish(self, s: Stream) -> None:
        if s.partial:
            self._emit(s, [s.partial])
            if s.filtered is not None:
                self._duplicate(s, [s.partial])
            s.partial = b""
        try:
            self._selector.unregister(s.fd)
        except (KeyError, ValueError):
            pass
        if s.file:
            try:
                s.file.close()
            except OSError:
                pass
        if s.pipe is not None:  # one pipe per worker stream and round: keeping them leaks fds (the soak)
            s.pipe.close()
            s.pipe = None
        if s.held is not None and not self._closing:  # `done` once its traceback is judged
            s.ended, s.held_at = True, self._clock()
            return
        s.done.set()

    # ------------------------------------------------------------------ tracebacks held

    def _hold(self, s: Stream, lines: list[bytes]) -> list[bytes]:
        """The lines to print now; a traceback and what follows it are kept back (`s.held`)."""
        if s.name != "stderr" or s.console is None or s.rank is None or (s.file is None and not s.keep):
            return lines  # no file would keep it: never held
        out = []
        for line in lines:
            if s.held is None:
                if not _bare(s, line).startswith(TRACEBACK):
                    out.append(line)
                    continue
                s.held = []
                self._holding.append(s)
            s.held.append(line)
            s.held_at = self._clock()
            if len(s.held) > MAX_HELD:
                out += s.held
                s.held = None
                self._holding.remove(s)
        return out

    def _judge_held(self) -> None:
        """Release the tracebacks that can be judged now (see TRACEBACK)."""
        now = self._clock()
        for s in list(self._holding):
            root = self.root
            if not s.ended:
                if now - s.held_at >= QUIET:  # a worker still running printed it: whole
                    self._release(s, whole=True)
            elif root is None and now - s.held_at >= AFTER_EXIT:
                self._release(s, whole=True)
            elif root is not None:
                self._release(s, whole=root[0] == s.rank, root=root)

    def _keep(self, s: Stream, held: list[bytes]) -> str | None:
        """Write a held traceback to `s.keep` (the stream has no file of its own); its path, None if it cannot."""
        if not s.keep:
            return None
        try:
            os.makedirs(os.path.dirname(s.keep), exist_ok=True)
            with open(s.keep, "ab") as f:
                f.write(b"".join(line + b"\n" for line in held))
        except OSError as e:
            self.disk_error(s.keep, e)
            return None
        return s.keep

    def _release(self, s: Stream, whole: bool, root: tuple[int, str] | None = None) -> None:
        """Print `s`'s held traceback: whole, or as one line naming `root` (the failure as judged: read
        once, since the supervisor's `new_round` may clear `self.root` meanwhile)."""
        held, s.held = s.held or [], None
        if s in self._holding:
            self._holding.remove(s)
        where = None if whole or root is None else (s.path if s.path and s.file is not None else self._keep(s, held))
        if where is None:
            self._write(s, held)
        else:
            error = next((line for line in reversed(held) if line.strip()), b"")
            error = _bare(s, error)
            rank, what = root  # type: ignore[misc]
            after = f"rank {rank} {what}" if rank >= 0 else what
            note = f"  (after {after}; the whole traceback is in {where})".encode()
            self._write(s, [error[:300] + (b"..." if len(error) > 300 else b"") + note])
        if s.ended:
            s.done.set()

    def _emit(self, s: Stream, lines: list[bytes]) -> None:
        s.last_line = _bare(s, lines[-1]).decode(errors="replace").rstrip("\r")[-200:]
        s.last_at = time.monotonic()
        if s.console is None:
            return
        self._write(s, self._hold(s, lines))

    def _write(self, s: Stream, lines: list[bytes]) -> None:
        if not lines or s.console is None:
            return
        out = b"".join(_prefixed(s, line) + b"\n" for line in lines)
        with CONSOLE_LOCK:
            try:
                s.console.write(out)
                s.console.flush()
            except (OSError, ValueError):  # a closed terminal must not kill the pump
                pass


def _prefixed(s: Stream, line: bytes) -> bytes:
    """One console line: torch's excepthook already prefixes a worker's traceback with "[rankN]: "
    (init_process_group installs it); that prefix becomes ours (`[host rankN]: ` across nodes),
    so it is never said twice."""
    if s.torch_prefix and line.startswith(s.torch_prefix):
        return s.prefix + _bare(s, line)
    return line if line.startswith(s.prefix) else s.prefix + line


def _bare(s: Stream, line: bytes) -> bytes:
    """`line` without torch's "[rankN]: " (its excepthook's, on a worker's own errors), if it has it."""
    return line[len(s.torch_prefix) :] if s.torch_prefix and line.startswith(s.torch_prefix) else line


# ---------------------------------------------------------------------------- routing policy


@dataclass(frozen=True)
class Routing:
    """Where worker streams go and how their lines are prefixed: --redirects, --tee,
    --local_ranks_filter, --log_dir, --role, and whether the job spans nodes."""

    redirects: Std
    tee: Std
    local_ranks_filter: frozenset[int] | None = None
    log_dir: str | None = None
    role: str = "default"
    multi_node: bool = False

    def destinations(self, local_rank: int, stream: str) -> tuple[bool, bool]:
        """Where one worker stream goes: (whether to the console, whether to its file).

        `--redirects` sends a stream to its file only, `--tee` to both; `--local_ranks_filter`
        hides ranks from the console but never from their files; `--log_dir` keeps every file.
        """
        redirected = self.redirects.has(local_rank, stream)
        teed = self.tee.has(local_rank, stream)
        hidden = self.local_ranks_filter is not None and local_rank not in self.local_ranks_filter
        console = not hidden and (teed or not redirected)
        to_file = bool(self.log_dir) or redirected or teed or hidden
        return console, to_file

    def prefix(self, worker: Worker, host: str, environ: Mapping[str, str]) -> str:
        """`[rank3]: `, with the host in multi-node jobs; TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is used as
        given, as torchrun uses it (`${role_name}`, `${rank}`, `${local_rank}`, and our `${host}`)."""
        template = environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
        if template:
            from string import Template

            fields = {"role_name": self.role, "local_rank": worker.local_rank, "rank": worker.rank, "host": host}
            return Template(template).safe_substitute(fields)
        if self.multi_node:
            return f"[{host} rank{worker.rank}]: "
        return f"[rank{worker.rank}]: "
