"""A tiny HTTP server on 127.0.0.1 that answers with fixture responses.

Used to run the real boto3 / google-cloud clients against responses in the APIs' documented
formats (the clouds themselves are unreachable here). Each route maps (method, path prefix,
optional X-Amz-Target) to a JSON body, an XML text (EC2's query API answers in XML), a
``(status, XML text)`` pair for an error, or a callable that answers from the request body (one of
those from ``bytes``); every request is recorded for assertions.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _matches(amz: str | None, target: str | None, body: bytes) -> bool:
    """A route's third field: None (any request), an X-Amz-Target, or ``Action=<name>`` matched in
    the form body (EC2's query API names the action there)."""
    if amz is None or amz == target:
        return True
    return amz.startswith("Action=") and (amz + "&").encode() in body + b"&"


class ReplayServer:
    """Serve ``routes``: list of (method, path_prefix, amz_target or ``Action=...`` or None, body
    dict, XML text, ``(status, body)`` or a callable of the request body returning one of those)."""

    def __init__(self, routes):
        self.routes = routes
        self.requests: list[tuple[str, str, str | None, bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                target = self.headers.get("X-Amz-Target")
                server.requests.append((method, self.path, target, body))
                for m, prefix, amz, response in server.routes:
                    if m == method and self.path.startswith(prefix) and _matches(amz, target, body):
                        if callable(response):
                            response = response(body)
                        status, response = response if isinstance(response, tuple) else (200, response)
                        if isinstance(response, str):
                            payload, kind = response.encode(), "text/xml;charset=UTF-8"
                        else:
                            payload = json.dumps(response).encode()
                            kind = "application/json" if amz is None else "application/x-amz-json-1.1"
                        self.send_response(status)
                        self.send_header("Content-Type", kind)
                        self.send_header("Content-Length", str(len(payload)))
                        self.end_headers()
                        self.wfile.write(payload)
                        return
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):  # noqa: N802
                self._serve("GET")

            def do_POST(self):  # noqa: N802
                self._serve("POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
