"""The health gate's command run for real (/bin/sh) through a node's `Governor`: a check that fails
quarantines the node and notes it for the scheduler; one the leaving agent stops notes nothing."""

from __future__ import annotations

import threading

from support.processes import wait_for

from launcher.policy.governor import Governor
from launcher.policy.health import HealthGate
from launcher.spec import RestartPolicy


def test_a_check_the_leaving_agent_stops_quarantines_nothing(tmp_path):
    """SIGTERM while the health check runs (srun ends a step whose other node failed its own): the agent's
    close kills the check, and the node is not noted (it was excluded from the requeue beside the failed one)."""
    noted = tmp_path / "quarantined"
    gate = HealthGate("sleep 30", nvml=lambda: None)
    governor = Governor(RestartPolicy(), "node1", gate=gate, note=(str(noted), "node1"))
    said: list[str] = []
    admitting = threading.Thread(target=lambda: said.append(governor.admit()))
    admitting.start()
    wait_for(lambda: gate._running is not None, 10, "the health check running")
    governor.close()
    admitting.join(10)
    assert said == ["the agent is leaving: its health check was stopped"] and not noted.exists()


def test_a_check_that_fails_notes_the_node(tmp_path):
    noted = tmp_path / "quarantined"
    gate = HealthGate("echo disk full; exit 1", nvml=lambda: None)
    said = Governor(RestartPolicy(), "node2", gate=gate, note=(str(noted), "node2")).admit()
    assert said == "health check failed: --health_check 'echo disk full; exit 1' exited 1: disk full"
    assert noted.read_text() == "node2\n"


def test_a_check_asked_for_once_the_agent_is_leaving_never_starts(tmp_path):
    """The agent's close can come between the rendezvous thread's decision to check and the check's process
    (a SIGTERM right then; the check, in a session of its own, outlived the agent): none starts after it."""
    ran = tmp_path / "ran"
    gate = HealthGate(f"touch {ran}", nvml=lambda: None)
    governor = Governor(RestartPolicy(), "node3", gate=gate, note=(str(tmp_path / "quarantined"), "node3"))
    governor.close()
    assert governor.admit() == "the agent is leaving: its health check was stopped"
    assert not ran.exists() and not (tmp_path / "quarantined").exists()
