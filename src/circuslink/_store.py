"""Rendezvous store: a small TCP key-value server that ranks use to find each other.

Every rank of a job talks to one store. The launcher (``circuslink run``) hosts it,
so it outlives any rank and can record which rank exited and how; under
``mpirun`` rank 0 hosts it and tells the others its address through MPI.
All of :class:`circuslink.World`'s collectives (barrier, allgather) are built on
:meth:`StoreClient.set` and :meth:`StoreClient.wait_all`, which is the one place
where a collective waits; so there is one place that enforces the time-out and
names the ranks that did not arrive.

Wire format: each message is a list of byte strings, framed as
``u32 count, then (u32 length, bytes)`` per field. No pickle crosses the socket.
Clients authenticate with a random token handed down in the environment.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import socketserver
import struct
import threading
import time

from .errors import PeerError

EXIT_PREFIX = "__exit__/"   # the launcher writes EXIT_PREFIX + rank -> exit description
_U32 = struct.Struct("!I")
_MAX_FIELD = 1 << 31


def _send_fields(sock: socket.socket, fields: list[bytes]) -> None:
    parts = [_U32.pack(len(fields))]
    for f in fields:
        parts.append(_U32.pack(len(f)))
        parts.append(f)
    sock.sendall(b"".join(parts))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_fields(sock: socket.socket) -> list[bytes]:
    (count,) = _U32.unpack(_recv_exact(sock, 4))
    fields = []
    for _ in range(count):
        (length,) = _U32.unpack(_recv_exact(sock, 4))
        if length > _MAX_FIELD:
            raise ConnectionError("oversized store message")
        fields.append(_recv_exact(sock, length))
    return fields


class _State:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.joined = 0  # clients that said hello with the right token: ranks that have joined


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = self.server.state
        try:
            hello = _recv_fields(sock)
            if len(hello) != 2 or hello[0] != b"hello" or not hmac.compare_digest(hello[1], self.server.token):
                return
            with state.cond:
                state.joined += 1
            _send_fields(sock, [b"ok"])
            while True:
                fields = _recv_fields(sock)
                op = fields[0]
                if op == b"set":
                    with state.cond:
                        state.data[fields[1].decode()] = fields[2]
                        state.cond.notify_all()
                    _send_fields(sock, [b"ok"])
                elif op == b"delete":
                    with state.cond:
                        for key in fields[1:]:
                            state.data.pop(key.decode(), None)
                    _send_fields(sock, [b"ok"])
                elif op == b"poll":
                    # poll(wait_s, key, owner_rank, key, owner_rank...): wait up to wait_s until every
                    # key is present or the owner of a missing key has exited (the launcher writes
                    # EXIT_PREFIX + rank); reply with the keys present, then those owners' exit notes.
                    wait_s = float(fields[1].decode())
                    keys = [k.decode() for k in fields[2::2]]
                    owners = [o.decode() for o in fields[3::2]]
                    deadline = time.monotonic() + wait_s
                    with state.cond:
                        while True:
                            present = [k for k in keys if k in state.data]
                            dead = [
                                EXIT_PREFIX + o
                                for k, o in zip(keys, owners, strict=True)
                                if k not in state.data and EXIT_PREFIX + o in state.data
                            ]
                            remaining = deadline - time.monotonic()
                            if len(present) == len(keys) or dead or remaining <= 0:
                                break
                            state.cond.wait(remaining)
                        reply = [b"ok", str(len(present)).encode()]
                        for k in present + dead:
                            reply += [k.encode(), state.data[k]]
                    _send_fields(sock, reply)
                else:
                    _send_fields(sock, [b"error", b"unknown op " + op])
        except (ConnectionError, OSError, struct.error):
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, token: bytes) -> None:
        self.state = _State()
        self.token = token
        super().__init__((host, 0), _Handler)


class StoreServer:
    """Runs the store on a background thread. ``address`` is ``host:port``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.token = secrets.token_hex(16)
        self._server = _Server(host, self.token.encode())
        self._thread = threading.Thread(target=self._server.serve_forever, name="circuslink-store", daemon=True)
        self._thread.start()
        h, p = self._server.server_address[:2]
        self.address = f"{h}:{p}"

    def set_local(self, key: str, value: bytes) -> None:
        """Write a key from the hosting process (the launcher records exits this way)."""
        with self._server.state.cond:
            self._server.state.data[key] = value
            self._server.state.cond.notify_all()

    def joined(self) -> int:
        """How many clients have connected with the job's token (the launcher's progress while ranks start)."""
        with self._server.state.cond:
            return self._server.state.joined

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class StoreClient:
    """One connection to the store; thread-safe."""

    def __init__(self, address: str, token: str, connect_timeout: float) -> None:
        host, port = address.rsplit(":", 1)
        self.address = address
        self._reply_timeout = connect_timeout
        self._lock = threading.Lock()
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=connect_timeout)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise PeerError(f"cannot reach the rendezvous store at {address}: {exc}") from None
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._call([b"hello", token.encode()])

    def _call(self, fields: list[bytes], wait_s: float = 0.0) -> list[bytes]:
        # Every reply is bounded: a store that stops answering (its host died mid-reply) must
        # raise, not leave this rank blocked in recv() forever.
        with self._lock:
            try:
                self._sock.settimeout(wait_s + self._reply_timeout)
                _send_fields(self._sock, fields)
                reply = _recv_fields(self._sock)
            except TimeoutError:
                raise PeerError(
                    f"the rendezvous store at {self.address} did not answer within "
                    f"{wait_s + self._reply_timeout:g} s; the rank or launcher hosting it has probably died"
                ) from None
            except (ConnectionError, OSError) as exc:
                raise PeerError(
                    f"lost the rendezvous store at {self.address} ({exc}); the rank or launcher hosting it "
                    "has probably died"
                ) from None
        if reply[0] != b"ok":
            raise PeerError(f"store refused a request: {b' '.join(reply).decode(errors='replace')}")
        return reply

    def set(self, key: str, value: bytes) -> None:
        self._call([b"set", key.encode(), value])

    def delete(self, *keys: str) -> None:
        if keys:
            self._call([b"delete", *(k.encode() for k in keys)])

    def poll(self, owned_keys: dict[str, int], wait_s: float) -> tuple[dict[str, bytes], dict[int, str]]:
        """Wait up to ``wait_s`` for every key (mapped to the rank that writes it).

        Returns the values present and, for ranks that exited without writing their key,
        the launcher's description of how they exited.
        """
        fields = [b"poll", f"{wait_s:.3f}".encode()]
        for key, owner in owned_keys.items():
            fields += [key.encode(), str(owner).encode()]
        reply = self._call(fields, wait_s)
        n_present = int(reply[1])
        items = reply[2:]
        pairs = [(items[i].decode(), items[i + 1]) for i in range(0, len(items), 2)]
        present = dict(pairs[:n_present])
        exited = {int(k[len(EXIT_PREFIX):]): v.decode(errors="replace") for k, v in pairs[n_present:]}
        return present, exited

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def new_job_id() -> str:
    return f"{os.getpid():x}{secrets.token_hex(3)}"
