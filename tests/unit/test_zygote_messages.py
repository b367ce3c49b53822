"""The records the agent and the zygote exchange: each encoded in one place, decoded once, intact."""

from __future__ import annotations

from launcher.agent.zygote.messages import ENTRY, ForkRequest, Program, Reply, ZygoteArgs


def test_the_zygotes_command_line_round_trips_and_names_the_entry_point():
    args = ZygoteArgs(sock_fd=7, agent=1234, modules=("torch", "torch._dynamo", "mypkg.model"))
    argv = args.argv("/usr/bin/python3")
    assert argv[:3] == ["/usr/bin/python3", "-m", ENTRY] and ENTRY == "launcher.agent.zygote"
    # as the zygote sees it: sys.argv[0] is the module's path, not "-m"
    assert ZygoteArgs.parse(["/x/launcher/agent/zygote/__main__.py", *argv[3:]]) == args
    assert ZygoteArgs.parse(["m", "3", "9"]).modules == ()


def test_a_fork_request_round_trips_with_its_cpus():
    request = ForkRequest(
        program=Program(target="train.py", module=False),
        args=("--lr", "0.1", "ünïcode"),
        env={"RANK": "0", "PATH": "/bin"},
        cwd="/work",
        cpus=(0, 1, 16, 17),
    )
    assert ForkRequest.decode(request.encode()) == request
    plain = ForkRequest(Program("pkg.main", True), (), {}, "/")
    assert ForkRequest.decode(plain.encode()).cpus == ()


def test_replies_round_trip():
    for reply in (Reply(seconds=1.25), Reply(pid=4242), Reply(error="module 'x' failed to import")):
        assert Reply.decode(reply.encode()) == reply
