"""A fault-injecting HTTP proxy in front of the S3 server, in a process of its own.

The state workers reach S3 only through it (``AWS_ENDPOINT_URL`` points here).
On a fraction of requests (``rate``, re-read from the control file while it runs,
so the fault schedule can raise it for a burst) it does one of:

* ``error``        answers 503 SlowDown without forwarding (the request never happened);
* ``error-after``  forwards, then answers 500 (the request happened, the client sees a failure:
                   an S3 PUT whose reply was lost);
* ``stall``        holds the request past the client's read timeout, before or after forwarding;
* ``slow``         forwards and sends the reply's body in small pieces with pauses;
* ``drop``         closes the connection without a reply, before or after forwarding.

``latency_s`` in the control file delays every forwarded request by that long (an object store's
first-byte latency, for ``benchmarks.remote_restore``). A request no fault strikes has its reply passed on as it
arrives (a client that stops reading stops the transfer, as on S3); the stats count the reply bytes sent and the GETs
of row images (``*.img``) with and without a byte range, and ``GET /__proxy_stats`` answers the counts at
once (``tests/support/s3_proxy.py`` reads them).

Every fault is appended to the log as one JSON line (time, kind, method, path), and the
totals are rewritten to ``<log>.stats.json`` every few seconds, so the soak's report can
count them even if this process is killed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KINDS = ("error", "error-after", "stall", "slow", "drop")
#: Headers that describe one hop, not the message (RFC 9110 7.6.1), plus those http.client sets itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"})


class Control:
    """The fault settings, re-read from a JSON file when it changes: ``{"rate": 0.02, "stall_s": 20, "latency_s": 0.01}``."""

    def __init__(self, path: Path):
        self.path = path
        self._stamp = None
        self.rate, self.stall_s, self.mix = 0.0, 20.0, {k: 1.0 for k in KINDS}
        self.latency_s = 0.0

    def refresh(self) -> None:
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if stamp == self._stamp:
            return
        try:
            conf = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return   # half-written: the next refresh reads it
        self._stamp = stamp
        self.rate = float(conf.get("rate", self.rate))
        self.stall_s = float(conf.get("stall_s", self.stall_s))
        self.latency_s = float(conf.get("latency_s", self.latency_s))
        self.mix = {k: float(v) for k, v in conf.get("mix", self.mix).items() if k in KINDS}


class FaultLog:
    """Appends one JSON line per fault and keeps the totals (requests, faults by kind) in a stats file."""

    def __init__(self, path: Path):
        self.path = path
        self.stats_path = Path(f"{path}.stats.json")
        self._lock = threading.Lock()
        self._file = open(path, "a", buffering=1)
        self.requests = 0
        self.bytes = 0
        self.faults = {k: 0 for k in KINDS}
        self.image_gets = {"range": 0, "whole": 0}

    def request(self) -> None:
        with self._lock:
            self.requests += 1

    def image_get(self, ranged: bool) -> None:
        with self._lock:
            self.image_gets["range" if ranged else "whole"] += 1

    def sent(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    def fault(self, kind: str, method: str, path: str, detail: str = "") -> None:
        with self._lock:
            self.faults[kind] += 1
            self._file.write(json.dumps({"t": time.time(), "kind": kind, "method": method, "path": path,
                                         "detail": detail}) + "\n")

    def write_stats(self) -> None:
        with self._lock:
            body = json.dumps({"t": time.time(), "requests": self.requests, "bytes": self.bytes,
                               "faults": self.faults})
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(body)
        tmp.replace(self.stats_path)


class Dropped(Exception):
    """The proxy closes this connection without a reply."""


#: A file to append one JSON line per forwarded request to (start, end, method, path, range): where a
#: restore's time goes, request by request (benchmarks; off unless SPARK_STATE_PROXY_TRACE names a file).
_TRACE = os.environ.get("SPARK_STATE_PROXY_TRACE")
_TRACE_LOCK = threading.Lock()


def _trace(started: float, method: str, path: str, ranged: str) -> None:
    line = json.dumps({"t0": started, "t1": time.time(), "m": method, "path": path, "range": ranged})
    with _TRACE_LOCK, open(_TRACE, "a") as f:
        f.write(line + "\n")


def make_handler(upstream: tuple[str, int], control: Control, log: FaultLog, rng: random.Random):
    lock = threading.Lock()

    def draw() -> tuple[str | None, bool]:
        """(fault kind or None, whether it strikes after forwarding)."""
        with lock:
            if rng.random() >= control.rate:
                return None, False
            kinds, weights = zip(*control.mix.items())
            return rng.choices(kinds, weights)[0], rng.random() < 0.5

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # a reply is written in pieces (status and headers, then the body): with Nagle's algorithm on, a
        # keep-alive client's delayed ACK holds the body back 40 ms, which S3 never adds
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:   # one line per request would drown the soak's log
            pass

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*upstream, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                return reply.status, [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP], data
            finally:
                conn.close()

        def _stream(self, body: bytes) -> None:
            """Forwards a request no fault strikes, passing the reply's body on as it arrives: a client that
            stops reading (s3fs reads a large object's first GET only for its size, then in ranges) stops the
            transfer, as on S3, and only the bytes sent are counted."""
            conn = http.client.HTTPConnection(*upstream, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                reply = conn.getresponse()
                length = reply.getheader("Content-Length")
                if length is None and self.command != "HEAD":   # no length to announce: pass it on whole
                    data = reply.read()
                    log.sent(len(data))
                    self._send(reply.status, [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP], data)
                    return
                self.send_response_only(reply.status)
                for k, v in reply.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if self.command == "HEAD":
                    return
                while chunk := reply.read(1 << 16):
                    self.wfile.write(chunk)
                    log.sent(len(chunk))
            finally:
                conn.close()

        def _send(self, status: int, headers: list[tuple[str, str]], data: bytes, slow: bool = False) -> None:
            self.send_response_only(status)
            for k, v in headers:
                if k.lower() != "content-length":
                    self.send_header(k, v)
            length = dict((k.lower(), v) for k, v in headers).get("content-length", str(len(data)))
            self.send_header("Content-Length", length if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if not slow:
                self.wfile.write(data)
                return
            step = max(1, len(data) // 8)
            for i in range(0, len(data), step):
                self.wfile.write(data[i:i + step])
                self.wfile.flush()
                time.sleep(0.25)

        def _error(self, status: int, code: str) -> None:
            data = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f'<Message>injected by the soak proxy</Message></Error>').encode()
            self._send(status, [("Content-Type", "application/xml")], data)

        def _handle(self) -> None:
            if self.path == "/__proxy_stats":   # the counts now (benchmarks), not a request to S3
                with log._lock:
                    data = json.dumps({"requests": log.requests, "bytes": log.bytes,
                                       "imageGets": dict(log.image_gets)}).encode()
                self._send(200, [("Content-Type", "application/json")], data)
                return
            log.request()
            started = time.time()
            if self.command == "GET" and urllib.parse.urlsplit(self.path).path.endswith(".img"):
                log.image_get("Range" in self.headers)
            body = self._body()
            kind, after = draw()
            if kind:
                log.fault(kind, self.command, self.path, "after" if after else "before")
            try:
                if kind == "error" or (kind == "error-after" and not after):
                    self._error(503, "SlowDown")
                    return
                if kind in ("stall", "drop") and not after:
                    if kind == "stall":
                        time.sleep(control.stall_s)
                    raise Dropped
                if control.latency_s > 0:
                    time.sleep(control.latency_s)
                if kind is None:
                    self._stream(body)
                    if _TRACE:
                        _trace(started, self.command, self.path, self.headers.get("Range", ""))
                    return
                status, headers, data = self._forward(body)
                if self.command != "HEAD":
                    log.sent(len(data))
                if kind == "error-after":
                    self._error(500, "InternalError")
                    return
                if kind in ("stall", "drop"):
                    if kind == "stall":
                        time.sleep(control.stall_s)
                    raise Dropped
                self._send(status, headers, data, slow=kind == "slow")
            except Dropped:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            except (http.client.HTTPException, OSError) as err:
                # the upstream failed or the client went away: never take the proxy down
                self.close_connection = True
                try:
                    self._error(502, f"BadGateway {type(err).__name__}")
                except OSError:
                    pass

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


def serve(port: int, upstream_port: int, control_path: Path, log_path: Path, seed: int) -> None:
    control, log = Control(control_path), FaultLog(log_path)
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(("127.0.0.1", upstream_port), control, log,
                                                                   random.Random(seed)))
    server.daemon_threads = True

    def housekeeping():
        while True:
            control.refresh()
            log.write_stats()
            time.sleep(1)

    control.refresh()
    threading.Thread(target=housekeeping, daemon=True).start()
    server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--control", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.pop("AWS_ENDPOINT_URL", None)
    serve(args.port, args.upstream_port, args.control, args.log, args.seed)


if __name__ == "__main__":
    main()
