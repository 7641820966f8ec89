"""An HTTP/1.1 proxy in front of a real server on loopback that adds a latency to every
request/response exchange: the model of remote storage in the DTGG benchmark.

``mode="serial"`` (the per-request model): each answer goes out ``delay`` seconds after the
loopback server gave it, and a connection's requests are served one after another: the next
request is read only once the previous answer has gone out. That is what a server with
``delay`` of work per request does with HTTP/1.1 pipelining (Jetty, the NameNode's HTTP server,
answers a connection's pipelined requests in order, one at a time; S3's first-byte latency of
~10-50 ms per request is mostly its own work). So N requests cost N x ``delay`` on one
connection, pipelined or not; only separate connections (each has its own thread here, as each
has its own handler on a real server) overlap their delays.

``mode="link"`` (the network model): the delay is a round trip on the wire, half on the way in,
half on the way out, and requests in flight overlap, as pipelined requests do on a real link to
a remote server whose own work is small (a remote NameNode: a few hundred microseconds per
listing, the rest is distance). Pipelining then hides most of it.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

MODES = ("serial", "link")


class HttpLatencyProxy:
    """Listens on ``port``; each client connection gets its own upstream connection.

    ``requests``: exchanges served; ``log``: (connection, request read at, answer sent at) of each
    (``time.monotonic()``)."""

    def __init__(self, upstream: int, delay: float, mode: str = "serial"):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {MODES}")
        self.upstream, self.delay, self.mode = upstream, delay, mode
        self.requests, self.connections = 0, 0
        self.log: list[tuple[int, float, float]] = []
        self._lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                conn = self.connections
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = self._serial if self.mode == "serial" else self._link
            threading.Thread(target=_guarded, args=(target, conn, client, upstream), daemon=True).start()

    def _serial(self, conn: int, client: socket.socket, upstream: socket.socket) -> None:
        requests, answers = client.makefile("rb"), upstream.makefile("rb")
        while (request := _read_request(requests, client)) is not None:
            method, raw, read_at = request
            upstream.sendall(raw)
            answer, close = _read_response(answers, method)
            time.sleep(self.delay)
            self._record(conn, read_at)  # before the answer leaves: a client that has it sees it counted
            client.sendall(answer)
            if close:
                return

    def _link(self, conn: int, client: socket.socket, upstream: socket.socket) -> None:
        """Requests go upstream delay/2 after they arrived, answers to the client delay/2 after the
        server gave them. Reading never waits on a delay (two delay lines do), so requests in
        flight overlap and each is timed from when it really arrived."""
        methods: queue.Queue = queue.Queue()
        to_upstream = _DelayLine(upstream)
        to_client = _DelayLine(client, on_sent=lambda read_at: self._record(conn, read_at))
        answers = threading.Thread(target=self._answers, args=(upstream, methods, to_client), daemon=True)
        answers.start()
        requests = client.makefile("rb")
        try:
            while (request := _read_request(requests, client)) is not None:
                method, raw, read_at = request
                methods.put((method, read_at))
                to_upstream.put(read_at + self.delay / 2, raw, None)
        finally:
            methods.put(None)
            to_upstream.put(0.0, None, None)
            answers.join()
            to_client.thread.join()

    def _answers(self, upstream: socket.socket, methods: queue.Queue, to_client: _DelayLine) -> None:
        reader = upstream.makefile("rb")
        try:
            while (item := methods.get()) is not None:
                method, read_at = item
                answer, close = _read_response(reader, method)
                to_client.put(time.monotonic() + self.delay / 2, answer, read_at)
                if close:
                    return
        except (OSError, ValueError):
            return
        finally:
            to_client.put(0.0, None, None)

    def _record(self, conn: int, read_at: float) -> None:
        with self._lock:
            self.requests += 1
            self.log.append((conn, read_at, time.monotonic()))


class _DelayLine:
    """Sends each queued message at its deadline, in order (deadlines never decrease); ``on_sent``
    is called with its tag as it goes out."""

    def __init__(self, sock: socket.socket, on_sent=None):
        self.sock, self.on_sent = sock, on_sent
        self.items: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, deadline: float, data: bytes | None, tag) -> None:
        self.items.put((deadline, data, tag))

    def _run(self) -> None:
        while True:
            deadline, data, tag = self.items.get()
            if data is None:
                return
            _sleep_until(deadline)
            if self.on_sent is not None:
                self.on_sent(tag)
            try:
                self.sock.sendall(data)
            except OSError:
                return


def _guarded(target, conn: int, client: socket.socket, upstream: socket.socket, *rest) -> None:
    try:
        target(conn, client, upstream, *rest)
    except (OSError, ValueError):
        pass  # a peer went away or spoke something else: drop the connection
    finally:
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _sleep_until(when: float) -> None:
    left = when - time.monotonic()
    if left > 0:
        time.sleep(left)


def _read_request(reader, client: socket.socket) -> tuple[str, bytes, float] | None:
    """(method, the whole request as bytes, when it was read); None at the end of the connection.
    ``Expect: 100-continue`` is answered here and dropped, so the body follows at once."""
    head = _read_head(reader)
    if head is None:
        return None
    lines = head.split(b"\r\n")
    headers = _headers(lines[1:])
    if headers.get(b"expect", b"").lower() == b"100-continue":
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        lines = [line for line in lines if not line.lower().startswith(b"expect:")]
        head = b"\r\n".join(lines)
    body = _read_body(reader, headers, to_close=False)
    return lines[0].split(b" ", 1)[0].decode("ascii"), head + body, time.monotonic()


def _read_response(reader, method: str) -> tuple[bytes, bool]:
    """(the whole answer, interim 1xx answers included, as bytes; whether the connection ends after it)."""
    out = b""
    while True:
        head = _read_head(reader)
        if head is None:
            raise ValueError("the server closed the connection before answering")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = _headers(lines[1:])
        if 100 <= status < 200:
            out += head
            continue
        bodiless = method == "HEAD" or status in (204, 304)
        body = b"" if bodiless else _read_body(reader, headers, to_close=True)
        close = headers.get(b"connection", b"").lower() == b"close" or lines[0].startswith(b"HTTP/1.0")
        ends = not bodiless and b"content-length" not in headers and b"transfer-encoding" not in headers
        return out + head + body, close or ends


def _read_head(reader) -> bytes | None:
    """The start line and headers up to and including the blank line; None at a clean end."""
    lines = []
    while (line := reader.readline(65537)) not in (b"\r\n", b"\n"):
        if not line:
            if lines:
                raise ValueError("connection closed inside a message head")
            return None
        lines.append(line)
    return b"".join(lines) + b"\r\n"


def _headers(lines: list[bytes]) -> dict[bytes, bytes]:
    out = {}
    for line in lines:
        name, _, value = line.partition(b":")
        if name:
            out[name.strip().lower()] = value.strip()
    return out


def _read_body(reader, headers: dict[bytes, bytes], to_close: bool) -> bytes:
    if headers.get(b"transfer-encoding", b"").lower().endswith(b"chunked"):
        raw = bytearray()
        while True:
            size_line = reader.readline(65537)
            raw += size_line
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                break
            raw += _exactly(reader, size + 2)
        while (trailer := reader.readline(65537)) not in (b"\r\n", b"\n", b""):
            raw += trailer
        return bytes(raw + b"\r\n")
    if b"content-length" in headers:
        return _exactly(reader, int(headers[b"content-length"]))
    return reader.read() if to_close else b""


def _exactly(reader, size: int) -> bytes:
    data = reader.read(size)
    if len(data) < size:
        raise ValueError("connection closed inside a message body")
    return data
