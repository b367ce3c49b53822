"""The etcd store (launcher/rendezvous/etcd/) against a real etcd: a lease etcd revoked is taken
again with its keys; only the first agent of a run sweeps a dead run's leftovers; wait_get answers
from the read or from the watch. Skipped without the `etcd` binary (Debian: etcd-server)."""

from __future__ import annotations

import threading
import time

import pytest
from support.etcd import client, keys_of, needs_etcd


@needs_etcd
@pytest.mark.timeout(30)
def test_a_lost_lease_is_taken_again_with_its_keys(etcd):
    from launcher.rendezvous.etcd.lease import Lease
    from launcher.rendezvous.etcd.settings import EtcdOptions
    from launcher.rendezvous.etcd.store import EtcdStore

    opts = EtcdOptions(endpoints=(("127.0.0.1", etcd.client_port),))
    lease = Lease(opts, ttl=2, interval=0.2)
    store = EtcdStore(opts, lease)
    c = client(etcd)
    try:
        store.register("relet", "node-a", retry_for=10)
        store.hold("relet/r0/alive1")
        first = lease.id
        c.revoke_lease(first)  # what etcd does to an agent it thought dead: its keys go
        assert keys_of(etcd, "relet") == []
        # the lease's thread puts the keys on the new lease, then takes its id: wait for both
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(keys_of(etcd, "relet")) < 2 or lease.id == first):
            time.sleep(0.05)
        assert sorted(keys_of(etcd, "relet")) == [b"/launcher/relet/agents/node-a", b"/launcher/relet/r0/alive1"]
        assert lease.id != first and c.get("/launcher/relet/r0/alive1")[1].lease_id == lease.id
        store.leave("relet")
    finally:
        lease.close()  # a failed assertion above must not leave its thread refreshing
        c.close()
        store.close()
    assert keys_of(etcd, "relet") == []


@needs_etcd
@pytest.mark.timeout(30)
def test_only_an_agent_that_finds_nobody_signed_in_sweeps_and_wait_get_returns_the_value(etcd):
    from launcher.rendezvous.etcd.lease import Lease
    from launcher.rendezvous.etcd.settings import EtcdOptions
    from launcher.rendezvous.etcd.store import EtcdStore

    opts = EtcdOptions(endpoints=(("127.0.0.1", etcd.client_port),))
    c = client(etcd)
    c.put("/launcher/sweep/round", b"7")  # a dead run's leftover
    stores = [EtcdStore(opts, Lease(opts, ttl=5, interval=1)) for _ in range(2)]
    try:
        stores[0].register("sweep", "node-a", retry_for=10)  # nobody signed in: the leftover goes
        assert keys_of(etcd, "sweep") == [b"/launcher/sweep/agents/node-a"]
        stores[0].set("sweep/round", b"0")
        stores[1].register("sweep", "node-b", retry_for=10)  # node-a is in: nothing is swept
        assert sorted(keys_of(etcd, "sweep")) == [
            b"/launcher/sweep/agents/node-a",
            b"/launcher/sweep/agents/node-b",
            b"/launcher/sweep/round",
        ]
        assert stores[1].wait_get("sweep/round", 1.0) == b"0"  # present: from the read
        later = threading.Timer(0.3, lambda: c.put("/launcher/sweep/plan1", b"yours"))
        later.start()
        assert stores[1].wait_get("sweep/plan1", 5.0) == b"yours"  # from the watch's event
        assert stores[1].wait_get("sweep/never", 0.2) is None
    finally:
        for st in stores:
            st.leave("sweep")
            st.close()
        c.close()
    assert keys_of(etcd, "sweep") == []
