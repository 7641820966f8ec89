"""A TCP proxy in front of a real server on loopback, to model what the network does to it:
a delay per client chunk (the per-request latency of remote storage) or a connection cut
after some answer bytes (a server or middlebox dropping a kept-open connection)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpProxy:
    """Listens on ``port``; each client connection gets its own upstream connection.

    ``delay``: seconds every client->server chunk is held. ``cut_after``: answer bytes after
    which each connection is closed (None: never)."""

    def __init__(self, upstream: int, *, delay: float = 0.0, cut_after: int | None = None):
        self.upstream, self.delay, self.cut_after, self.connections = upstream, delay, cut_after, 0
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
            threading.Thread(target=_pump, args=(client, upstream, self.delay, None), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, 0.0, self.cut_after), daemon=True).start()

    def close(self) -> None:
        self.server.close()


def _pump(src: socket.socket, dst: socket.socket, delay: float, limit: int | None) -> None:
    try:
        while data := src.recv(65536 if limit is None else min(limit, 65536)):
            if delay:
                time.sleep(delay)
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
