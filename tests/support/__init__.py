"""What the tests share: starting and finding processes, free ports, the launcher run as a
subprocess, a real store and etcd, network namespaces, a breakable TCP relay and a fake clock.

Importable from every layer (`pythonpath = tests` in setup.cfg); tests/conftest.py holds only the
fixtures built from these modules.
"""
