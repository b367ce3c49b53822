"""The OOM-kill count read from the cgroup (v1 and v2), on a hand-made /proc and /sys tree."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("version", [1, 2])
def test_oom_kill_count_is_read_from_the_cgroup(tmp_path, version):
    from launcher.agent.oom import oom_kills

    proc = tmp_path / "cgroup"
    root = tmp_path / "sys"
    if version == 2:
        proc.write_text("0::/job/step\n")
        (root / "job" / "step").mkdir(parents=True)
        (root / "job" / "step" / "memory.events").write_text(
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"
        )
    else:
        proc.write_text("5:devices:/\n4:memory:/job/step\n0::/\n")
        (root / "memory" / "job" / "step").mkdir(parents=True)
        (root / "memory" / "job" / "step" / "memory.oom_control").write_text(
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
        )
    assert oom_kills(str(proc), str(root)) == 2
    assert oom_kills(str(tmp_path / "missing"), str(root)) is None
    assert isinstance(oom_kills(), (int, type(None)))  # this machine's own, whatever it has
