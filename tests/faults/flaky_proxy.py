"""A fault-injecting HTTP proxy on 127.0.0.1 in front of one real S3 server (not a test module).

Every request is read whole and forwarded to the upstream server with its headers untouched
(the Host header too, so the client's SigV4 signature still verifies), and the upstream's answer
is relayed back. A deterministic share of the requests fails instead:

- every `every`-th request (counted from 1, after `warmup` requests; only requests whose method
  is in `methods`, when given) gets an injected fault, the kinds of `kinds` in turn:
  `slowdown` (503 SlowDown, as S3 throttles), `internal` (500 InternalError), `reset` (the
  connection is reset before the request reaches the server, as a load balancer drops it) and
  `lost` (the server carries the request out, then the connection is reset before its answer
  arrives: the client cannot tell that it succeeded, and retries what is already done);
  and the two hangs of `STALLS`, never in the default rotation: `stall` (the request is read,
  never forwarded and never answered: the connection stays open, silent, until the proxy
  stops) and `stall_body` (the request is carried out and the answer's status line, headers
  and first few body bytes are sent, then nothing more: a server that stops mid-answer);
- every `truncate_every`-th successful GET with a body is cut: the full Content-Length is
  announced, half the body is sent, then the connection is reset (a download cut mid-way);
- once `hang_all` is set (at any time, from the test), every later request stalls: storage
  that keeps hanging;
- at most `limit` faults of the first kinds and `truncate_limit` truncations are injected, so a
  test always ends.

`counts` says how many of each kind were really injected, `requests` how many were seen. The
proxy runs in daemon threads and stops itself after `lifetime` seconds even if nobody calls
`stop()`.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections import Counter
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KINDS = ("slowdown", "internal", "reset", "lost")
STALLS = ("stall", "stall_body")
# Headers that belong to one hop, not to the request: never forwarded as they came.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "expect",
    "te",
    "upgrade",
    "content-length",
}
_ERRORS = {
    "slowdown": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "internal": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
}


class FlakyProxy:
    """`with FlakyProxy("127.0.0.1:8333") as proxy:` then point the client at `proxy.url`."""

    def __init__(
        self,
        upstream: str,
        every: int = 5,
        limit: int = 30,
        kinds: tuple[str, ...] = KINDS,
        truncate_every: int = 0,
        truncate_limit: int = 0,
        warmup: int = 0,
        methods: tuple[str, ...] | None = None,
        lifetime: float = 600.0,
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.every = every
        self.limit = limit
        self.kinds = kinds
        self.truncate_every = truncate_every
        self.truncate_limit = truncate_limit
        self.warmup = warmup
        self.methods = methods
        self.counted = 0
        self.lifetime = lifetime
        self.requests = 0
        self.gets = 0
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._stopped = threading.Event()  # releases the stalled connections
        self.hang_all = False

    # ------------------------------------------------------------ life cycle

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def injected(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def start(self) -> FlakyProxy:
        handler = type("Handler", (_Handler,), {"proxy": self})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name="flaky-proxy",
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        server, self._server = self._server, None
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> FlakyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the schedule

    def _fault_for_request(self, method: str) -> str | None:
        with self._lock:
            self.requests += 1
            if self.hang_all:
                self.counts["stall"] += 1
                return "stall"
            if self.methods is not None and method not in self.methods:
                return None
            self.counted += 1
            number = self.counted - self.warmup
            due = number > 0 and self.every > 0 and number % self.every == 0
            injected = sum(self.counts[k] for k in self.kinds)
            if not due or injected >= self.limit:
                return None
            kind = self.kinds[injected % len(self.kinds)]
            self.counts[kind] += 1
            return kind

    def _truncate_this_get(self) -> bool:
        with self._lock:
            self.gets += 1
            due = self.truncate_every > 0 and self.gets % self.truncate_every == 0
            if not due or self.counts["truncate"] >= self.truncate_limit:
                return False
            self.counts["truncate"] += 1
            return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and `Expect: 100-continue` is answered
    proxy: FlakyProxy

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    def do_GET(self) -> None:
        self._relay()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _relay(self) -> None:
        body = self._read_body()
        fault = self.proxy._fault_for_request(self.command)
        if fault == "reset":
            self._reset()
            return
        if fault in _ERRORS:
            self._error(fault)
            return
        if fault == "stall":
            self._stall()
            return
        try:
            status, reason, headers, data = self._forward(body)
        except OSError:  # the upstream is down: what a client sees from a dead server
            self._reset()
            return
        if fault == "lost":
            self._reset()
            return
        if fault == "stall_body" and (self.command == "HEAD" or len(data) < 8):
            self._stall()  # no body to stop in the middle of: hang before the answer
            return
        cut = (
            self.command == "GET"
            and status in (200, 206)
            and len(data) >= 2
            and self.proxy._truncate_this_get()
        )
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            length = next((v for n, v in headers if n.lower() == "content-length"), "0")
            self.send_header("Content-Length", length)
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault == "stall_body":
            self.wfile.write(data[:4])
            self.wfile.flush()
            self._stall()
            return
        if cut:
            self.wfile.write(data[: len(data) // 2])
            self._reset()
            return
        self.wfile.write(data)

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        return None if length is None else self.rfile.read(int(length))

    def _forward(self, body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.proxy.upstream, timeout=120)
        try:
            connection.putrequest(
                self.command, self.path, skip_host=True, skip_accept_encoding=True
            )
            for name, value in self.headers.items():
                if name.lower() not in _HOP:
                    connection.putheader(name, value)
            if body is not None:
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            response = connection.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            connection.close()

    def _error(self, kind: str) -> None:
        status, reason, code, message = _ERRORS[kind]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{self.path.split('?')[0]}</Resource>"
            f"<RequestId>flaky-proxy-{self.proxy.requests}</RequestId></Error>"
        ).encode()
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if kind == "slowdown":
            self.send_header("Retry-After", "1")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _stall(self) -> None:
        """Keep the connection open and silent until the proxy stops, then drop it."""
        self.proxy._stopped.wait()
        self._reset()

    def _reset(self) -> None:
        """Abort the connection with a TCP RST: the client sees 'connection reset by peer'."""
        self.close_connection = True
        with suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
