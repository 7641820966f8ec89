"""Just enough Hadoop IPC for an ApplicationMaster: the AM-RM protocol over Hadoop RPC v9 with SASL
DIGEST-MD5 authentication by the AMRMToken, written from the public .proto files
(RpcHeader, ProtobufRpcEngine, IpcConnectionContext, yarn_service_protos) and RFC 2831.

Why: an AM that never calls registerApplicationMaster leaves its application ACCEPTED (never
RUNNING) and is expired by the RM's AM liveness monitor (yarn.am.liveness-monitor.expiry-interval-ms,
10 min by default), which fails the attempt. The ResourceManager enforces token authentication on
this port even on an insecure cluster, so a plain connection is refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import struct
import uuid
from dataclasses import dataclass

AMRM_TOKEN_KIND = "YARN_AM_RM_TOKEN"
AM_PROTOCOL = "org.apache.hadoop.yarn.api.ApplicationMasterProtocolPB"
SASL_CALL_ID, CONTEXT_CALL_ID = -33, -3
FINAL_STATUS = {"UNDEFINED": 0, "SUCCEEDED": 1, "FAILED": 2, "KILLED": 3}
AM_RESYNC, AM_SHUTDOWN = 1, 2
_SASL_SUCCESS, _SASL_NEGOTIATE, _SASL_INITIATE, _SASL_CHALLENGE, _SASL_RESPONSE = range(5)
# what pb() can encode: a varint, a fixed32, a length-delimited string or message, or nothing
FieldValue = bool | int | float | str | bytes | None


class IpcError(RuntimeError):
    """The RPC server refused a call or the connection; the message names the server's exception."""

    def __init__(self, message: str, exception_class: str = ""):
        super().__init__(message)
        self.exception_class = exception_class


def encode_command(command: list[str]) -> str:
    """A worker's command for the AM (PRIMUS_YARN_COMMAND): base64 JSON, because the NodeManager
    writes environment values and the command line into its launch script between double quotes."""
    return base64.b64encode(json.dumps(command).encode()).decode()


def decode_command(value: str) -> list[str]:
    return json.loads(base64.b64decode(value))


# -- protobuf wire format (proto2, only what these messages use) ---------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def pb(*fields: tuple[int, FieldValue]) -> bytes:
    """Encode (number, value) pairs: int -> varint (negatives as 64-bit, like int32/int64),
    float -> fixed32, str/bytes -> length-delimited; None is skipped."""
    out = bytearray()
    for number, value in fields:
        if value is None:
            continue
        if isinstance(value, bool | int):
            out += _varint(number << 3) + _varint(int(value) & (2**64 - 1))
        elif isinstance(value, float):
            out += _varint(number << 3 | 5) + struct.pack("<f", value)
        else:
            data = value.encode() if isinstance(value, str) else bytes(value)
            out += _varint(number << 3 | 2) + _varint(len(data)) + data
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def unpb(buf: bytes) -> dict[int, list]:
    """Decode a message into {field number: [values]} (varints as int, the rest as bytes)."""
    fields: dict[int, list] = {}
    pos = 0
    value: int | bytes
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = buf[pos : pos + width], pos + width
        else:
            raise IpcError(f"unsupported protobuf wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def _delimited(message: bytes) -> bytes:
    return _varint(len(message)) + message


def _split_delimited(buf: bytes) -> list[bytes]:
    parts, pos = [], 0
    while pos < len(buf):
        size, pos = _read_varint(buf, pos)
        parts.append(buf[pos : pos + size])
        pos += size
    return parts


def _zigzag(n: int) -> int:
    return ((n << 1) ^ (n >> 31)) & 0xFFFFFFFF


def _signed32(n: int) -> int:
    n &= 0xFFFFFFFF
    return n - 2**32 if n >= 2**31 else n


def _first(fields: dict[int, list], number: int, default=None):
    return fields.get(number, [default])[0]


# -- Hadoop credentials (the container's HADOOP_TOKEN_FILE_LOCATION) -----------------------------
@dataclass
class Token:
    identifier: bytes
    password: bytes
    kind: str
    service: str


def _read_vlong(buf: bytes, pos: int) -> tuple[int, int]:
    """org.apache.hadoop.io.WritableUtils.readVLong."""
    first = struct.unpack_from("b", buf, pos)[0]
    pos += 1
    if first >= -112:
        return first, pos
    negative = first < -120
    size = (-119 - first) if negative else (-111 - first)
    value = int.from_bytes(buf[pos : pos + size - 1], "big")
    return (~value if negative else value), pos + size - 1


def _read_text(buf: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = _read_vlong(buf, pos)
    return buf[pos : pos + size], pos + size


def read_tokens(data: bytes) -> list[Token]:
    """Parse a Credentials token storage file ("HDTS" + format 0 = Writable, 1 = protobuf)."""
    if data[:4] != b"HDTS":
        raise IpcError("not a Hadoop token storage file (no HDTS magic)")
    tokens: list[Token] = []
    if data[4] == 1:
        size, pos = _read_varint(data, 5)
        for kv in unpb(data[pos : pos + size]).get(1, []):
            token = unpb(_first(unpb(kv), 2, b""))
            tokens.append(
                Token(
                    _first(token, 1, b""),
                    _first(token, 2, b""),
                    _first(token, 3, b"").decode(),
                    _first(token, 4, b"").decode(),
                )
            )
        return tokens
    count, pos = _read_vlong(data, 5)
    for _ in range(count):
        _alias, pos = _read_text(data, pos)
        identifier, pos = _read_text(data, pos)
        password, pos = _read_text(data, pos)
        kind, pos = _read_text(data, pos)
        service, pos = _read_text(data, pos)
        tokens.append(Token(identifier, password, kind.decode(), service.decode()))
    return tokens


def token_from_proto(buf: bytes) -> Token:
    """hadoop.common.TokenProto (a rolled AMRMToken arrives in AllocateResponseProto field 12)."""
    f = unpb(buf)
    return Token(_first(f, 1, b""), _first(f, 2, b""), _first(f, 3, b"").decode(), _first(f, 4, b"").decode())


# -- SASL DIGEST-MD5 (RFC 2831, qop=auth) as Hadoop's token authentication uses it ---------------
def _directives(challenge: str) -> dict[str, str]:
    return {
        m.group(1).lower(): (m.group(3) if m.group(3) is not None else m.group(2)).replace('\\"', '"')
        for m in re.finditer(r'([\w-]+)\s*=\s*("((?:[^"\\]|\\.)*)"|[^,]*)', challenge)
    }


def digest_values(user: str, password: str, realm: str, nonce: str, cnonce: str, nc: str, uri: str) -> tuple[str, str]:
    """RFC 2831 (md5-sess, qop=auth): the client's ``response`` and the server's expected ``rspauth``."""

    def hex_md5(data: bytes) -> str:
        return hashlib.md5(data).hexdigest()

    a1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).digest() + f":{nonce}:{cnonce}".encode()
    ha1 = hex_md5(a1)
    response = hex_md5(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{hex_md5(f'AUTHENTICATE:{uri}'.encode())}".encode())
    rspauth = hex_md5(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{hex_md5(f':{uri}'.encode())}".encode())
    return response, rspauth


def digest_md5(challenge: bytes, token: Token, protocol: str, server_id: str) -> tuple[bytes, str]:
    """The client response to a DIGEST-MD5 challenge and the rspauth value the server must send back.
    Hadoop's user name and password are the base64 of the token's identifier and password; the
    digest-uri is protocol/serverId as the server announced them ("/default" for YARN tokens)."""
    d = _directives(challenge.decode())
    if "auth" not in [q.strip() for q in d.get("qop", "auth").split(",")]:
        raise IpcError(f"the server offers qop {d.get('qop')!r}; only 'auth' is implemented")
    user = base64.b64encode(token.identifier).decode()
    password = base64.b64encode(token.password).decode()
    realm, nonce = d.get("realm", server_id), d["nonce"]
    cnonce, nc, uri = base64.b64encode(os.urandom(24)).decode(), "00000001", f"{protocol}/{server_id}"
    response, rspauth = digest_values(user, password, realm, nonce, cnonce, nc, uri)
    text = (
        f'charset=utf-8,username="{user}",realm="{realm}",nonce="{nonce}",nc={nc},cnonce="{cnonce}",'
        f'digest-uri="{uri}",maxbuf=65536,response={response},qop=auth'
    )
    return text.encode(), rspauth


# -- the RPC connection ---------------------------------------------------------------------------
def request_header(call_id: int, retry: int, client_id: bytes) -> bytes:
    """RpcRequestHeaderProto: rpcKind = RPC_PROTOCOL_BUFFER, rpcOp = RPC_FINAL_PACKET, callId and
    retryCount (both sint32: zigzag, so the SASL call -33 is sent as 65), clientId."""
    return pb((1, 2), (2, 0), (3, _zigzag(call_id)), (4, client_id), (5, _zigzag(retry)))


class RpcConnection:
    """One authenticated Hadoop RPC v9 connection for one protocol (calls are sequential)."""

    def __init__(self, address: tuple[str, int], token: Token, protocol: str, timeout: float = 30.0):
        self.protocol, self.client_id, self.call_id = protocol, uuid.uuid4().bytes, 0
        self.sock = socket.create_connection(address, timeout=timeout)
        try:
            self.sock.sendall(b"hrpc" + bytes([9, 0, SASL_CALL_ID & 0xFF]))  # version 9, class 0, SASL
            self._sasl(token)
            context = pb((3, protocol))  # IpcConnectionContextProto; no user info with token auth
            self._send(self._header(CONTEXT_CALL_ID, -1), context)
        except BaseException:
            self.sock.close()
            raise

    def _header(self, call_id: int, retry: int, client_id: bytes | None = None) -> bytes:
        return request_header(call_id, retry, self.client_id if client_id is None else client_id)

    def _send(self, *messages: bytes) -> None:
        payload = b"".join(_delimited(m) for m in messages)
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def _recv_exact(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise IpcError("the RPC server closed the connection")
            data += chunk
        return bytes(data)

    def _receive(self) -> tuple[int, bytes]:
        (length,) = struct.unpack(">I", self._recv_exact(4))
        size, pos = _read_varint(body := self._recv_exact(length), 0)
        header = unpb(body[pos : pos + size])
        call_id, status = _signed32(_first(header, 1, 0)), _first(header, 2, 0)
        if status != 0:
            cls, msg = _first(header, 4, b"").decode(), _first(header, 5, b"").decode()
            raise IpcError(f"{cls}: {msg.splitlines()[0] if msg else ''}".strip(": "), cls)
        rest = _split_delimited(body[pos + size :])
        return call_id, rest[0] if rest else b""

    def _sasl(self, token: Token) -> None:
        self._send(self._header(SASL_CALL_ID, -1, b""), pb((2, _SASL_NEGOTIATE)))
        expected = None
        while True:
            call_id, body = self._receive()
            if call_id != SASL_CALL_ID:
                raise IpcError(f"non-SASL response (call {call_id}) during negotiation")
            msg = unpb(body)
            state = _first(msg, 2, 0)
            if state == _SASL_NEGOTIATE:
                auths = [unpb(a) for a in msg.get(4, [])]
                auth = next((a for a in auths if _first(a, 2) == b"DIGEST-MD5" and _first(a, 1) == b"TOKEN"), None)
                if auth is None:
                    offered = [(_first(a, 1, b"").decode(), _first(a, 2, b"").decode()) for a in auths]
                    raise IpcError(f"the server offers no TOKEN/DIGEST-MD5 authentication: {offered}")
                protocol, server_id = _first(auth, 3, b"").decode(), _first(auth, 4, b"").decode()
                reply_auth = pb((1, "TOKEN"), (2, "DIGEST-MD5"), (3, protocol), (4, server_id))
                challenge = _first(auth, 5)
                if challenge is None:
                    raise IpcError("the server sent no DIGEST-MD5 challenge with its negotiation")
                response, expected = digest_md5(challenge, token, protocol, server_id)
                self._send(self._header(SASL_CALL_ID, -1, b""), pb((2, _SASL_INITIATE), (3, response), (4, reply_auth)))
            elif state == _SASL_SUCCESS:
                final = _directives((_first(msg, 3, b"") or b"").decode())
                if expected and final.get("rspauth") not in (None, expected):
                    raise IpcError("the server's DIGEST-MD5 rspauth does not match (wrong token?)")
                return
            else:
                raise IpcError(f"unexpected SASL state {state} (CHALLENGE/RESPONSE rounds are not implemented)")

    def call(self, method: str, request: bytes) -> bytes:
        call_id, self.call_id = self.call_id, self.call_id + 1
        method_header = pb((1, method), (2, self.protocol), (3, 1))  # RequestHeaderProto, protocol version 1
        self._send(self._header(call_id, 0), method_header, request)
        while True:
            got, body = self._receive()
            if got == call_id:
                return body

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class AMRMClient:
    """registerApplicationMaster / allocate (the heartbeat) / finishApplicationMaster."""

    def __init__(self, address: tuple[str, int], token: Token, timeout: float = 30.0):
        self.address, self.token, self.timeout = address, token, timeout
        self.response_id = 0
        self.conn: RpcConnection | None = None

    def _call(self, method: str, request: bytes) -> dict[int, list]:
        if self.conn is None:
            self.conn = RpcConnection(self.address, self.token, AM_PROTOCOL, self.timeout)
        try:
            return unpb(self.conn.call(method, request))
        except (OSError, IpcError) as exc:
            if isinstance(exc, IpcError) and exc.exception_class:
                raise  # the server answered: the connection is fine
            self.conn.close()
            self.conn = None
            raise

    def register(self, host: str, tracking_url: str = "") -> dict[int, list]:
        self.response_id = 0
        return self._call("registerApplicationMaster", pb((1, host), (2, 0), (3, tracking_url)))

    def heartbeat(self, progress: float = 0.0) -> int | None:
        """One allocate call asking for nothing; returns the RM's AM command (AM_RESYNC/AM_SHUTDOWN) or None."""
        reply = self._call("allocate", pb((4, self.response_id), (5, float(progress))))
        self.response_id = _first(reply, 2, self.response_id)
        if 12 in reply:  # the RM rolled its master key: reconnect with the new token
            self.token = token_from_proto(reply[12][0])
        return _first(reply, 1)

    def finish(self, status: str, diagnostics: str = "") -> bool:
        reply = self._call("finishApplicationMaster", pb((1, diagnostics), (2, ""), (3, FINAL_STATUS[status])))
        return bool(_first(reply, 1, 0))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
