"""What a Python worker runs, forked or spawned: its script as `__main__`, then python's exit less finalisation.

`python -u …/launcher/agent/worker_exit.py SCRIPT ARGS…` (or `… worker_exit.py -m MODULE ARGS…`) is how
the agent spawns a Python worker (`--worker_exit quick`, the default); that main file runs `main` here.
The script runs as under
`python -u SCRIPT` (argv, `sys.path[0]`, `__main__`, tracebacks, exit codes, signals), and its exit
runs python's exit steps (and the C runtime's flush) but skips finalising the interpreter, where torch's
teardown race lives
(gloo's thread asks for the GIL while `Py_FinalizeEx` runs, and the process dies of SIGABRT:
"terminate called without an active exception"). A worker forked by the zygote (`zygote.server`)
exits the same way. Only the standard library is imported here, and at start only modules every
interpreter has loaded already: any interpreter runs this file, and a spawned worker pays ~nothing
for it (docs/preload.md, "A worker's exit").
"""

from __future__ import annotations

# Only built-in modules, loaded before the script's folder heads sys.path (none can be the user's).
# threading, signal and ctypes are not imported here: each would cost a worker's start a few ms
# (functools, collections, enum), and `python -u SCRIPT` does not load them either.
import _imp
import _signal
import atexit
import gc
import io
import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs a worker's start ~10-30 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import NoReturn

# A worker whose code has returned writes its exit code to its progress file's path plus this: the
# agent then knows that what is left is the worker's exit, not its work (`members.returned`).
RETURNED_SUFFIX = ".returned"
_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the agent's package: this file, the zygote
# sys.path less this file's folder, as the worker starts: where the exit's own imports come from.
_START_PATH = [p for p in sys.path if os.path.abspath(p or os.curdir) != _OURS.rstrip(os.sep)]


def run_program(target: str, module: bool, args: Sequence[str]) -> None:
    """Run `target` as `__main__`, as `python SCRIPT` or `python -m MODULE` would (a folder or zip too)."""
    sys.argv = [target, *args]
    main = type(sys)("__main__")  # a fresh one, as the interpreter's: whatever ran before keeps its own
    main.__dict__.update(__annotations__={}, __builtins__=sys.modules["builtins"])
    sys.modules["__main__"] = main
    if module:
        import runpy  # here, not at the top: its imports (importlib.util, contextlib) cost a script ~5 ms

        sys.path[0] = os.getcwd()
        # what `python -m` itself runs: argv[0] the module's path, its errors worded as python's
        runpy._run_module_as_main(target)  # type: ignore[attr-defined]
    elif os.path.isfile(target) and not _is_zip(target):  # __file__ absolute, argv[0] as typed
        try:  # importlib.machinery's class, already loaded: importing importlib would cost ~1 ms
            from _frozen_importlib_external import SourceFileLoader
        except ImportError:  # an interpreter without CPython's frozen import machinery
            from importlib.machinery import SourceFileLoader

        path = os.path.abspath(target)
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path))
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, main.__dict__)
    else:  # a folder or a zip with __main__.py: python puts it first on the path and runs its __main__
        import runpy

        sys.path[0] = target
        runpy._run_module_as_main("__main__", False)  # type: ignore[attr-defined]


def _is_zip(path: str) -> bool:
    """Whether python would run `path` as a zip application (zipimport is loaded at start; zipfile is not)."""
    import zipimport

    try:
        zipimport.zipimporter(path)
    except zipimport.ZipImportError:
        return False
    return True


def exit_worker(run: Callable[[], None]) -> NoReturn:
    """Run the worker's code, then exit as `python` would, without finalising the interpreter.

    What `python` does at exit, in its order: print an uncaught exception, wait for the non-daemon
    threads, run the atexit handlers (the user's, logging's flush, multiprocessing's, weakref.finalize),
    free the script's globals and their garbage (an unclosed file is flushed, a `__del__` runs), flush
    stdio; then, where an interpreter would finalise every module (~0.7 s for torch's, and the teardown
    races of native threads that wait for the GIL), flush every file still open for writing and
    `os._exit` with the same code.
    """
    code, interrupted = 0, False
    try:
        run()
    except SystemExit as e:
        code = _system_exit_code(e.code)
    except KeyboardInterrupt:
        _print_uncaught()
        interrupted = True
    except BaseException:
        _print_uncaught()
        code = 1
    _mark_returned(code)
    leave(code, interrupted)


def leave(code: int, interrupted: bool = False, free_main: bool = True) -> NoReturn:
    """Python's exit steps once the program is done, then `os._exit(code)`, the interpreter not finalised:
    join the non-daemon threads, run the atexit handlers, free `__main__`'s globals (`free_main`), flush
    every file and C's buffers; die of SIGINT where `interrupted`. The agent leaves so too (`cli.start`)."""
    threading = sys.modules.get("threading")  # as Py_FinalizeEx: no threading module, no thread to join
    if threading is not None:
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as Py_FinalizeEx does
        except BaseException:
            sys.excepthook(*sys.exc_info())
    atexit._run_exitfuncs()  # prints a failing handler's traceback and goes on, as at a normal exit
    if free_main:
        _finalise_main()
    _flush_open_files()
    _flush_c_stdio()
    if interrupted:  # as python does for an uncaught KeyboardInterrupt: die of SIGINT
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
    os._exit(code & 0xFF)


def _print_uncaught() -> None:
    """The uncaught exception through `sys.excepthook`, its traceback starting at the user's code."""
    kind, value, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS):
        tb = tb.tb_next
    if value is not None:
        value.__traceback__ = tb  # the hook prints the exception's own traceback, not the one it is given
    sys.excepthook(kind, value, tb)  # type: ignore[arg-type]


def _finalise_main() -> None:
    """Free what the script's `__main__` holds and the cycles among it (a zygote's frozen preload is not looked at)."""
    main = sys.modules.get("__main__")
    if main is not None and main.__dict__ is not globals():  # never this module's own, run as `-m`
        main.__dict__.clear()  # a __del__ that raises is printed ("Exception ignored"), as at shutdown
    gc.collect()


def _flush_open_files() -> None:
    """Flush every file object still open (text layers first), then stdio: what finalisation would write.

    A file another module's global holds (a log opened at import) is closed by the interpreter's
    finalisation; without it, its buffer would be lost. Closing is left to the kernel."""
    # type(), not isinstance(): isinstance reads an object's `__class__`, which some objects compute, and
    # torch's deprecated `torch.distributed.reduce_op` printed a FutureWarning into every rank's exit so.
    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    files = [o for o in gc.get_objects() if issubclass(type(o), kinds)]
    files.sort(key=lambda o: not issubclass(type(o), io.TextIOWrapper))
    for f in [*files, sys.stdout, sys.stderr]:
        try:
            if not f.closed and f.writable():
                f.flush()
        except (OSError, ValueError, AttributeError):  # closed under us, a broken pipe, a replaced stream
            pass


def _flush_c_stdio() -> None:
    """`fflush(NULL)`, as the C runtime's `exit` does and `os._exit` does not: what native code printed
    (NCCL's INFO lines, a C++ `std::cout`) sits in C's buffer while stdout is a pipe to the agent.

    Only native code loaded by the worker can have filled one of C's buffers (the interpreter writes
    through its own files; `-u` leaves C's stdout and stderr unbuffered): a worker that loaded no
    extension module and no ctypes has nothing to flush, and is spared ctypes' import."""
    if not _native_code_loaded():
        return
    saved = sys.path
    sys.path = _START_PATH  # the standard library's ctypes, whatever the script's folder holds
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, ImportError):  # no C library to ask (a static build): nothing to flush
        pass
    finally:
        sys.path = saved


def _native_code_loaded() -> bool:
    """Whether any module loaded is an extension (a shared library) or ctypes, which loads libraries."""
    if "_ctypes" in sys.modules:
        return True
    suffixes = tuple(_imp.extension_suffixes())
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(suffixes):
            return True
    return False


def _system_exit_code(code: object) -> int:
    """`sys.exit(code)`'s exit status, as the interpreter computes it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return 1


def _mark_returned(code: int) -> None:
    """Tell the agent the worker's code has returned: its exit is not a hang (`RETURNED_SUFFIX`)."""
    progress = os.environ.get("LAUNCHER_PROGRESS_FILE")
    if not progress:
        return
    try:
        with open(progress + RETURNED_SUFFIX, "w") as f:
            f.write(f"{code}\n")
    except OSError:  # its folder is gone or read-only: the agent judges by output, as for a spawned worker
        pass


def main(argv: list[str]) -> NoReturn:
    """`worker SCRIPT ARGS…` or `worker -m MODULE ARGS…`: run it as `python -u` would, then exit quickly."""
    module = len(argv) > 1 and argv[1] == "-m"
    rest = argv[2:] if module else argv[1:]
    if not rest:
        print("usage: python worker_exit.py (SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr)
        os._exit(2)
    exit_worker(lambda: run_program(rest[0], module, rest[1:]))


if __name__ == "__main__":
    main(sys.argv)
