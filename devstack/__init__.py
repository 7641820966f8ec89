"""Launchers of the local development stack: the servers `make demo`, `make up` and the tests start.

Each module starts one real server as a child process on loopback ports and stops it by its PID
(``devstack.proc`` holds the shared start/stop helpers). Development tooling only: not part of
the installed product (``pip install`` ships ``primus_lib`` and ``primus_operators``, not this).
"""
