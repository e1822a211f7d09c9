"""The webhook's HTTPS server: ``POST /mutate`` (AdmissionReview v1) and ``GET /healthz``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from v2proxy.inject.patch import review
from v2proxy.inject.settings import SidecarSettings

MAX_BODY = 8 * 1024 * 1024  # the API server's own request limit is 3 MiB of object
log = logging.getLogger("v2proxy.inject")


class Certificate:
    """The server's TLS context, rebuilt when the certificate or key file changes."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._context = self._load()

    def _mtimes(self) -> tuple[int, int]:
        return Path(self.cert).stat().st_mtime_ns, Path(self.key).stat().st_mtime_ns

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._mtimes()
                if stamp != self._stamp:
                    self._stamp = stamp
                    self._context = self._load()
                    log.info("certificate reloaded from %s", self.cert)
            except (OSError, ssl.SSLError) as exc:
                log.warning("certificate not reloaded, keeping the previous one: %s", exc)
            return self._context


class WebhookServer(ThreadingHTTPServer):
    """One thread per connection; each accepted socket is wrapped in TLS by its thread."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], cert: Certificate, defaults: SidecarSettings
    ) -> None:
        self.cert = cert
        self.defaults = defaults
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10)
        try:
            tls = self.cert.context().wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            log.debug("TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            with contextlib.suppress(OSError):
                tls.shutdown(socket.SHUT_RDWR)
            tls.close()


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode())

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif self.path.split("?")[0] == "/mutate":
            self._error(405, "POST an AdmissionReview")
        else:
            self._error(404, "not found")

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/mutate":
            self._error(404, "not found")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(411, "Content-Length required")
            return
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._error(413, f"an AdmissionReview of at most {MAX_BODY} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length))
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            answer = review(body, self.server.defaults)
        except ValueError as exc:  # JSONDecodeError is one
            self._error(400, f"not an AdmissionReview v1 request: {exc}".splitlines()[0])
            return
        resp = answer["response"]
        obj = (body.get("request") or {}).get("object") or {}
        meta = obj.get("metadata") or {}
        name = meta.get("name") or meta.get("generateName", "") + "*"
        state = "patched" if "patch" in resp else "allowed" if resp["allowed"] else "refused"
        msg = resp.get("status", {}).get("message") or "; ".join(resp.get("warnings", []))
        log.info(
            "pod %s/%s: %s%s",
            body["request"].get("namespace", ""),
            name,
            state,
            f": {msg}" if msg else "",
        )
        self._send(200, json.dumps(answer).encode())

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def serve(host: str, port: int, cert_file: str, key_file: str, defaults: SidecarSettings) -> None:
    """Serves until SIGTERM/SIGINT."""
    server = WebhookServer((host, port), Certificate(cert_file, key_file), defaults)

    def stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "v2proxy inject on https://%s:%d/mutate (pid %d, default mode %s, image %s)",
        host,
        server.server_address[1],
        os.getpid(),
        defaults.mode,
        defaults.image,
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
