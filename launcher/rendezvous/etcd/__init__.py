"""The etcd backend: the protocol on etcd's v3 API, behind one thin adapter, `store.EtcdStore`.

`backend` (EtcdRendezvous: the protocol, signed in on a lease), `store` (the protocol's Store
operations on etcd), `lease` (this agent's lease and the keys on it), `settings` (parsed from the
flags at config time; imports no client), and a small engine interface (`engine`) with two engines:
etcd's JSON gateway spoken with the standard library and h11 (`gateway` over `http1`, the default:
no grpc or protobuf in the agent, a cheap import), and gRPC through pyetcd (`grpc_engine`), chosen
with `--rdzv_conf engine=grpc` and installed with the `etcd-grpc` extra (from a checkout: `pip
install -e '.[etcd-grpc]'`): the one case that needs it is a client certificate with a Common Name
on an etcd with --client-cert-auth and auth enabled, which the gateway refuses (a one-line error
that names both). Neither engine is
imported by `import launcher.cli.commands`, and this path never imports torch. This package file imports
nothing: `settings` is loaded at config time.
"""
