"""xdist's `--dist loadfile` with the longest test files handed out first, and the table that says which.

xdist hands each worker whole files, by default the files with the most tests first. The longest files
here have few tests (a job of several nodes each), so they came last, and one worker ran on alone for
~100 s after the others had ended. `LongestFirst` keeps xdist's units (one file each, so a module's
fixtures are set up once) and its hand-out (a worker with two tests left gets the next file); it only
picks, each time, the longest file left by `tests/file_times.txt`. A file missing from the table goes
first, as its time is unknown. `FileTimes` writes that table from a run: `--file-times PATH`.
"""

from __future__ import annotations

from pathlib import Path

from xdist.scheduler import LoadFileScheduling

TABLE = Path(__file__).resolve().parents[1] / "file_times.txt"


def read(path: Path = TABLE) -> dict[str, float]:
    """{file's node id: seconds} from a table of "SECONDS FILE" lines ({} if there is none)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    rows = (line.split(None, 1) for line in lines if line.strip() and not line.startswith("#"))
    return {name.strip(): float(seconds) for seconds, name in rows}


class LongestFirst(LoadFileScheduling):
    """`--dist loadfile`, each unit handed out the longest left (by `times`) first."""

    def __init__(self, config, log=None, times: dict[str, float] | None = None):
        super().__init__(config, log)
        self.times = read() if times is None else times

    def _assign_work_unit(self, node) -> None:
        longest = max(self.workqueue, key=lambda scope: self.times.get(scope, float("inf")))
        self.workqueue.move_to_end(longest, last=False)  # xdist's hand-out takes the queue's head
        super()._assign_work_unit(node)


class Scheduling:
    """The plugin that gives xdist `LongestFirst` for `--dist loadfile` (another mode keeps xdist's own)."""

    def pytest_xdist_make_scheduler(self, config, log):
        return LongestFirst(config, log) if config.getoption("dist") == "loadfile" else None


class FileTimes:
    """A plugin for the process that sees every report (xdist's controller, or pytest alone): sums each
    file's setup, call and teardown seconds and writes them to `path` at the end, the longest first."""

    def __init__(self, path: str):
        self.path, self.seconds = Path(path), {}

    def pytest_runtest_logreport(self, report) -> None:
        name = report.nodeid.split("::", 1)[0]
        self.seconds[name] = self.seconds.get(name, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        rows = sorted(self.seconds.items(), key=lambda row: -row[1])
        head = "# seconds per test file, one run (tests/support/schedule.py hands the longest out first)\n"
        self.path.write_text(head + "".join(f"{s:8.1f} {name}\n" for name, s in rows))
