"""A Cloud Storage JSON API stand-in on 127.0.0.1, as far as ``gcloud storage cp`` uses it for the
health gate's bucket (upload, create-only upload, listing, download), so that tests run the real
gcloud CLI against it (``CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE``).

What it answers, per the JSON API reference (cloud.google.com/storage/docs/json_api/v1/objects):
``objects.get`` (metadata, or the data with ``alt=media``), ``objects.list`` (``prefix``,
``delimiter``), ``objects.insert`` with ``uploadType=multipart``; ``ifGenerationMatch`` on an
insert must equal the live generation, 0 meaning "no live object", else 412 with the message GCS
gives (cloud.google.com/storage/docs/request-preconditions).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

PRECONDITION_MESSAGE = "At least one of the pre-conditions you specified did not hold."


class FakeGcs(ThreadingHTTPServer):
    """The server; ``objects`` maps (bucket, name) to (generation, data)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str], tuple[int, bytes]] = {}
        self.generation = 0
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The endpoint override (ends with ``/``)."""
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def resource(self, bucket: str, name: str) -> dict:
        """The object resource of a stored object."""
        generation, data = self.objects[(bucket, name)]
        return {
            "kind": "storage#object",
            "bucket": bucket,
            "name": name,
            "id": f"{bucket}/{name}/{generation}",
            "generation": str(generation),
            "metageneration": "1",
            "size": str(len(data)),
            "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(),
            "mediaLink": f"{self.url}download/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
            f"?generation={generation}&alt=media",
        }


class _Handler(BaseHTTPRequestHandler):
    server: FakeGcs

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, doc: dict | None = None, data: bytes | None = None) -> None:
        body = data if data is not None else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if data is not None else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"code": status, "message": message, "errors": [{"message": message}]}})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url, server = urlsplit(self.path), self.server
        query = parse_qs(url.query)
        if m := re.fullmatch(r"/(?:download/)?storage/v1/b/([^/]+)/o/(.+)", url.path):
            bucket, name = m.group(1), unquote(m.group(2))
            if (bucket, name) not in server.objects:
                return self._error(404, "No such object")
            if query.get("alt") == ["media"]:
                return self._send(200, data=server.objects[(bucket, name)][1])
            return self._send(200, server.resource(bucket, name))
        if m := re.fullmatch(r"/storage/v1/b/([^/]+)/o", url.path):
            prefix, delimiter = query.get("prefix", [""])[0], query.get("delimiter", [""])[0]
            items, prefixes = [], set()
            for bucket, name in sorted(server.objects):
                if bucket != m.group(1) or not name.startswith(prefix):
                    continue
                rest = name[len(prefix) :]
                if delimiter and delimiter in rest:
                    prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
                else:
                    items.append(server.resource(bucket, name))
            return self._send(
                200,
                {
                    "kind": "storage#objects",
                    **({"items": items} if items else {}),
                    **({"prefixes": sorted(prefixes)} if prefixes else {}),
                },
            )
        if m := re.fullmatch(r"/storage/v1/b/([^/]+)", url.path):
            return self._send(200, {"kind": "storage#bucket", "name": m.group(1)})
        return self._error(404, "Not Found")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        url, server = urlsplit(self.path), self.server
        query = parse_qs(url.query)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        m = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", url.path)
        if not m or query.get("uploadType") != ["multipart"]:
            return self._error(400, f"this stand-in answers multipart uploads only, not {self.path}")
        boundary = re.search(r"boundary=['\"]?([^'\";]+)", self.headers["Content-Type"]).group(1).encode()
        metadata, data = (_part_body(part) for part in body.split(b"--" + boundary)[1:3])
        key = (m.group(1), json.loads(metadata)["name"])
        wanted = query.get("ifGenerationMatch")
        if wanted is not None and int(wanted[0]) != server.objects.get(key, (0, b""))[0]:
            return self._error(412, PRECONDITION_MESSAGE)
        server.generation += 1
        server.objects[key] = (server.generation, data)
        return self._send(200, server.resource(*key))


def _part_body(part: bytes) -> bytes:
    """The body of one multipart part (headers end at the first empty line; the line break
    before the next boundary belongs to the boundary: RFC 2046 section 5.1.1)."""
    sep = b"\r\n\r\n" if b"\r\n\r\n" in part else b"\n\n"
    data = part.lstrip(b"\r\n").partition(sep)[2]
    return data[:-2] if data.endswith(b"\r\n") else data[:-1]
