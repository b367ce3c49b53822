"""The suite's own xdist scheduler (tests/support/schedule.py): the longest files are handed out first, each
file whole, a file the table does not know before any; the table reads back what `--file-times` wrote."""

from __future__ import annotations

from types import SimpleNamespace

from support import schedule


class Node:
    """What xdist's scheduler asks of a worker: the test indexes it is sent, in order."""

    shutting_down = False

    def __init__(self, name: str):
        self.gateway, self.sent = SimpleNamespace(id=name), []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


class Config:
    option = SimpleNamespace(loadscopereorder=True)

    def getvalue(self, name: str):
        return {"tx": ["2*popen"]}[name]


def test_the_longest_file_goes_first_and_each_file_stays_whole():
    collection = ["a.py::t1", "b.py::t1", "b.py::t2", "b.py::t3", "c.py::t1", "c.py::t2", "d.py::t1"]
    times = {"a.py": 5.0, "b.py": 50.0, "d.py": 1.0}  # c.py: not in the table
    scheduler = schedule.LongestFirst(Config(), times=times)
    nodes = [Node("gw0"), Node("gw1")]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    sent = [[collection[i].split("::")[0] for i in indexes] for node in nodes for indexes in node.sent]
    # c.py (unknown) then b.py, one to each node; the node left with two tests or fewer takes a.py next
    assert sent == [["c.py", "c.py"], ["a.py"], ["b.py", "b.py", "b.py"]], sent
    assert list(scheduler.workqueue) == ["d.py"]


def test_the_table_reads_back_what_a_run_wrote(tmp_path):
    times = schedule.FileTimes(str(tmp_path / "times.txt"))
    for nodeid, seconds in [("x.py::a", 1.5), ("y.py::b", 4.0), ("x.py::c", 0.25)]:
        times.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    times.pytest_sessionfinish()
    assert schedule.read(tmp_path / "times.txt") == {"y.py": 4.0, "x.py": 1.8}  # one decimal, longest first
    assert (tmp_path / "times.txt").read_text().splitlines()[1].endswith("y.py")
    assert schedule.read(tmp_path / "none.txt") == {}
