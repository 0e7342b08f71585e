"""A stand-in of the AWS Price List ``GetProducts`` endpoint on 127.0.0.1 for real boto3.

It answers ``AWSPriceListService.GetProducts`` (JSON 1.1 protocol) as documented
(docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html):
the products of ``ServiceCode`` whose attributes equal every ``TERM_MATCH`` filter
(``productFamily`` is the product's own field), as ``PriceList`` JSON strings, ``MaxResults`` per
page (default 100) with a ``NextToken``. ``error`` makes the calls for ``error_service`` (every
call when None) answer that error instead (``(status, __type)``, e.g.
``(400, "AccessDeniedException")``, one of the documented errors).
Every request body is recorded in ``requests``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _matches(product: dict, service_code: str, filters: list[dict]) -> bool:
    if product.get("serviceCode") != service_code:
        return False
    attributes = product["product"]["attributes"]
    for f in filters:
        if f.get("Type") != "TERM_MATCH":
            return False
        field = f["Field"]
        value = product["product"].get("productFamily") if field == "productFamily" else attributes.get(field)
        if value != f["Value"]:
            return False
    return True


class PriceListStandIn:
    """Serve ``products`` (Price List product documents as dicts) to GetProducts calls."""

    def __init__(self, products: list[dict], error: tuple[int, str] | None = None, error_service: str | None = None):
        self.products = products
        self.error = error
        self.error_service = error_service
        self.requests: list[dict] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                standin.requests.append(body)
                if self.headers.get("X-Amz-Target") != "AWSPriceListService.GetProducts":
                    status, answer = 400, {"__type": "UnknownOperationException", "message": "not a GetProducts call"}
                elif standin.error and standin.error_service in (None, body.get("ServiceCode")):
                    status, answer = standin.error[0], {"__type": standin.error[1], "Message": "stand-in error"}
                else:
                    status, answer = 200, standin.answer(body)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, body: dict) -> dict:
        """One GetProducts page for a request body."""
        found = [p for p in self.products if _matches(p, body.get("ServiceCode"), body.get("Filters", []))]
        start = int(body.get("NextToken") or 0)
        size = int(body.get("MaxResults") or 100)
        page = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in found[start : start + size]]}
        if start + size < len(found):
            page["NextToken"] = str(start + size)
        return page

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
