"""A TCP proxy in front of a real server on loopback that cuts each connection after some answer
bytes (a server or middlebox dropping a kept-open connection). Latency per HTTP request is
``devstack/http_latency.py``'s: a delay per TCP chunk let pipelined requests share one."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Listens on ``port``; each client connection gets its own upstream connection.

    ``cut_after``: answer bytes after which each connection is closed (None: never)."""

    def __init__(self, upstream: int, *, cut_after: int | None = None):
        self.upstream, self.cut_after, self.connections = upstream, cut_after, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=_pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, self.cut_after), daemon=True).start()

    def close(self) -> None:
        self.server.close()


def _pump(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
    try:
        while data := src.recv(65536 if limit is None else min(limit, 65536)):
            dst.sendall(data)
            if limit is not None:
                limit -= len(data)
                if limit <= 0:
                    break
    except OSError:
        pass
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
