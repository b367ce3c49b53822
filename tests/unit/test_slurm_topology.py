"""Slurm topology from SLURM_* as pure functions: node lists expanded (python-hostlist, scontrol as
the fallback), the deterministic master port, a step's variables over the job's, loud errors."""

from __future__ import annotations

import json
import re
import sys

import pytest
from support.slurm import step_env

from launcher import slurm
from launcher.errors import ConfigError


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
        ("n[001-004]", ["n001", "n002", "n003", "n004"]),
        ("a[1-2],b[7]", ["a1", "a2", "b7"]),
        ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("host-1.example.com", ["host-1.example.com"]),
        ("node[3,1]", ["node3", "node1"]),  # Slurm's order is kept: the first host is SLURM_NODEID 0
    ],
)
def test_expand_nodelist(text, hosts):
    assert slurm.expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-", "x[3-1]", "", "  ", "a]b"])
def test_expand_bad_nodelist_is_loud(text):
    with pytest.raises(ConfigError, match="node list"):
        slurm.expand_nodelist(text)


def test_scontrol_is_the_fallback_without_python_hostlist(monkeypatch):
    monkeypatch.setitem(sys.modules, "hostlist", None)  # import hostlist -> ImportError
    assert slurm.expand_nodelist("node[1-2]", scontrol=lambda t: ["node1", "node2"]) == ["node1", "node2"]
    # scontrol answers `node[1-` with `node]` and exit 0: that garbage is refused, not used
    with pytest.raises(ConfigError, match=r"scontrol show hostnames gave node\]"):
        slurm.expand_nodelist("node[1-", scontrol=lambda t: ["node]"])

    def missing(text):
        raise ConfigError("scontrol is not on PATH")

    with pytest.raises(ConfigError, match="python-hostlist is not installed and scontrol is not on PATH"):
        slurm.expand_nodelist("node[1-2]", scontrol=missing)


def test_master_port_is_deterministic_and_below_the_ephemeral_range():
    assert slurm.master_port("12345") == slurm.master_port(12345) == 20000 + 12345 % 9000
    ports = {slurm.master_port(j) for j in range(0, 50000, 7)}
    assert min(ports) >= 20000 and max(ports) < 29000  # below 29400/29500 and 32768
    with pytest.raises(ConfigError, match="SLURM_JOB_ID"):
        slurm.master_port("12_3")


def resolved(d: dict) -> dict:
    """Call the Unresolved entries: their ConfigError is what click would raise."""
    out = {}
    for k, v in d.items():
        try:
            out[k] = v() if callable(v) else v
        except ConfigError as e:
            out[k] = f"ERROR {e}"
    return out


def test_step_variables_win_over_the_jobs():
    # A step on node[2-3] of a node[1-3] job (as srun -N2 -r1 gives it): SLURM_NODEID is relative
    # to the step, and the job's first host (node1) is not in the step at all.
    assert slurm.defaults(step_env()) == {
        "nnodes": "2",
        "node_rank": "1",
        "master_addr": "node2",
        "master_port": str(20000 + 4242 % 9000),
    }


def test_job_variables_without_a_step():
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu-a[07-08]",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "16",
    }  # NTASKS of the job, not of a step: not checked
    assert slurm.defaults(env) == {"nnodes": "2", "node_rank": "0", "master_addr": "gpu-a07", "master_port": "20077"}
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NODELIST": "a,b", "SLURM_NODEID": "1"}
    assert slurm.defaults(env)["master_addr"] == "a"


def test_one_node_leaves_the_port_to_the_launcher():
    d = slurm.defaults(
        step_env(
            SLURM_STEP_NODELIST="node3",
            SLURM_STEP_NUM_NODES="1",
            SLURM_NTASKS="1",
            SLURM_STEP_NUM_TASKS="1",
            SLURM_NODEID="0",
        )
    )
    assert d == {"nnodes": "1", "node_rank": "0", "master_addr": "node3"}  # no master_port: a free one


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}, "nnodes", "runs 4 tasks on 2 nodes"),
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}, "node_rank", None),  # rank itself is fine
        ({"SLURM_NODEID": "2"}, "node_rank", "SLURM_NODEID=2 is out of range for SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_NODEID": None}, "node_rank", "SLURM_NODEID is not set"),
        ({"SLURM_NODEID": "x"}, "node_rank", "is not a node index"),
        ({"SLURM_STEP_NUM_NODES": "two"}, "nnodes", "SLURM_STEP_NUM_NODES='two' is not a number"),
        ({"SLURM_STEP_NUM_NODES": "0"}, "nnodes", "must be at least 1"),
        ({"SLURM_STEP_NODELIST": "node[2-"}, "master_addr", "cannot expand the node list 'node\\[2-'"),
        ({"SLURM_STEP_NODELIST": "node[1-3]"}, "master_addr", "has 3 hosts but SLURM_STEP_NUM_NODES=2"),
        # step count without the step's list: never mix in the job's list (its first host is node1)
        ({"SLURM_STEP_NODELIST": None}, "master_addr", "SLURM_STEP_NODELIST is not set"),
        ({"SLURM_STEP_NUM_NODES": None}, "nnodes", "SLURM_STEP_NUM_NODES is not set"),
        ({"SLURM_JOB_ID": None}, "master_port", "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "abc"}, "master_port", "SLURM_JOB_ID='abc' is not a number"),
    ],
)
def test_unresolvable_topology_is_a_loud_error(change, key, message):
    d = slurm.defaults(step_env(**change))
    value = resolved(d)[key]
    if message is None:
        assert not str(value).startswith("ERROR")
        return
    assert str(value).startswith("ERROR Slurm: ") and re.search(message, value), value
    assert "pass --" in value or "--ntasks-per-node=1" in value  # every message names the fix
    assert "\n" not in value
    assert "127.0.0.1" not in json.dumps(resolved(d)) and "localhost" not in json.dumps(resolved(d))


def test_in_step():
    assert slurm.in_step(step_env())
    assert not slurm.in_step(step_env(SLURM_STEP_ID=None))  # the batch script, salloc's shell
    assert not slurm.in_step(step_env(SLURM_JOB_ID=None))
    assert not slurm.in_step({})
    assert not slurm.in_step(step_env(LAUNCHER_SLURM="0"))  # the way out
