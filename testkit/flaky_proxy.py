"""A bucket that misbehaves as GCS does under load: an HTTP proxy on 127.0.0.1 in front of
fake-gcs-server that answers a share of requests with 429 or 503 (never passing them on), and
drops a share of connections, some before answering and some halfway through the answer.
Every other request goes through unchanged. `down` makes it answer 503 to everything: a
bucket gone for good. Clients reach it as they reach the emulator (gcs_server.client_env and
remote_config take either: both have `url`).

The choices come from a seeded generator, so a run's faults are the same each time for the
same sequence of requests; `injected` counts them by kind."""

import collections
import http.client
import http.server
import random
import socket
import struct
import threading
import urllib.parse

from testkit.gcs_server import free_port

FAULTS = ("429", "503", "reset before the answer", "reset halfway through the answer")  # the last: after the work


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up on an answer (its retry is under way): nothing to report


class FlakyProxy:
    def __init__(self, upstream_url: str, fail_share: float = 0.2, reset_share: float = 0.05, seed: int = 0):
        self.upstream = urllib.parse.urlsplit(upstream_url)
        self.fail_share, self.reset_share = fail_share, reset_share
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.injected = collections.Counter()
        self.passed = 0
        self.down = False
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = QuietServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FlakyProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _fault(self) -> str | None:
        with self.lock:
            if self.down:
                self.injected["503"] += 1
                return "503"
            roll = self.random.random()
            if roll < self.fail_share:
                fault = "429" if roll < self.fail_share / 2 else "503"
            elif roll < self.fail_share + self.reset_share:
                fault = FAULTS[2] if roll < self.fail_share + self.reset_share / 2 else FAULTS[3]
            else:
                self.passed += 1
                return None
            self.injected[fault] += 1
            return fault

    def _handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return out
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reset(self) -> None:
                # SO_LINGER 0: close() sends a TCP reset, as a dropped connection does.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _serve(self) -> None:
                body = self._body()
                fault = proxy._fault()
                if fault in ("429", "503"):
                    message = b'{"error": {"code": %s, "message": "injected by the test\'s flaky proxy"}}' % (
                        fault.encode()
                    )
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                if fault == FAULTS[2]:
                    return self._reset()
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "host")}
                headers["Host"] = proxy.upstream.netloc
                if body or self.command in ("POST", "PUT", "PATCH"):
                    headers["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                upstream.close()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == FAULTS[3]:  # (the request was carried out: the client cannot know)
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    return self._reset()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

        return Handler
