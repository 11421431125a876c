"""A thin HTTPS proxy in front of the local plane's API server, for the launcher's requests only.

It exists for the one fault no real component makes on purpose: a connection reset in the middle of
a streamed response (a load balancer's idle timeout, an API server restarting behind it, a NAT
table flushed). Every request is relayed unchanged (the launcher's own token authenticates it at
the real API server; RBAC, admission and APF apply as without the proxy); only a followed pod log
(``pods/{name}/log?follow=true``) is reset (TCP RST, no final chunk) ``cut_follow_s`` after it
started. The proxy serves the plane's ``test-webhook`` certificate (signed by the plane's CA, for
``127.0.0.1``), so the launcher's kubeconfig differs from its usual one only in ``server``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from finetune_assets_tests.core.launchers.k8s.plane import ControlPlane

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


class CuttingProxy:
    """Relays to the plane's API server; resets followed log streams after ``cut_follow_s``.
    ``cuts`` counts the streams it reset (a test asserts the fault happened).
    """

    def __init__(self, plane: ControlPlane, cut_follow_s: float):
        self.plane, self.cut_follow_s = plane, cut_follow_s
        self.cuts = 0
        self._lock = threading.Lock()
        server = json.loads(Path(plane.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
        up = urlparse(server)
        self.upstream = (up.hostname, up.port)
        pki = plane.dir / "pki"
        self.client_ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(
            str(pki / "test-webhook.crt"), str(pki / "test-webhook.key")
        )

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, source: str, path: Path) -> str:
        """A copy of kubeconfig ``source`` (JSON, as the plane writes them) through the proxy."""
        cfg = json.loads(Path(source).read_text())
        for cluster in cfg["clusters"]:
            cluster["cluster"]["server"] = self.url
        path.write_text(json.dumps(cfg))
        return str(path)

    def __enter__(self) -> CuttingProxy:
        proxy = self

        class Handler(_Relay):
            pass

        Handler.proxy = proxy
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = self.server_ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="api-proxy").start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Relay(BaseHTTPRequestHandler):
    proxy: CuttingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.relay()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET  # noqa: N815

    def relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        host, port = self.proxy.upstream
        up = http.client.HTTPSConnection(host, port, context=self.proxy.client_ctx, timeout=600)
        try:
            up.request(self.command, self.path, body=body, headers=headers)
            resp = up.getresponse()
            self.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            if resp.getheader("Content-Length") is not None:
                data = resp.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            url = urlparse(self.path)
            flag = parse_qs(url.query).get("follow", [""])[0].lower()
            follow = url.path.endswith("/log") and flag in ("true", "1")
            cut_at = time.monotonic() + self.proxy.cut_follow_s if follow else None
            while chunk := resp.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                if cut_at is not None and time.monotonic() > cut_at:
                    self.reset()
                    return
            self.wfile.write(b"0\r\n\r\n")
        finally:
            up.close()

    def reset(self) -> None:
        """Closes the launcher's connection with a TCP RST (SO_LINGER 0), mid-response."""
        with self.proxy._lock:  # noqa: SLF001
            self.proxy.cuts += 1
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()
