"""A stand-in of the AWS Price List ``GetProducts`` endpoint on 127.0.0.1 for real boto3.

It answers ``AWSPriceListService.GetProducts`` (JSON 1.1 protocol) as documented
(docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html):
the products of ``ServiceCode`` whose attributes equal every ``TERM_MATCH`` filter
(``productFamily`` is the product's own field), as ``PriceList`` JSON strings, ``MaxResults`` per
page (default 100) with a ``NextToken``. ``error`` makes the calls for ``error_service`` (every
call when None) answer that error instead (``(status, __type)``, e.g.
``(400, "AccessDeniedException")``, one of the documented errors).
Every request is recorded in ``requests``, as ReplayServer records it (method, path, target, body).
"""

from __future__ import annotations

import json

from tests.replay_server import ReplayServer

GET_PRODUCTS = "AWSPriceListService.GetProducts"


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


class PriceListStandIn(ReplayServer):
    """Serve ``products`` (Price List product documents as dicts) to GetProducts calls
    (:class:`tests.replay_server.ReplayServer` with one route that answers from the request)."""

    def __init__(self, products: list[dict], error: tuple[int, str] | None = None, error_service: str | None = None):
        self.products = products
        self.error = error
        self.error_service = error_service
        super().__init__([("POST", "/", GET_PRODUCTS, self._respond), ("POST", "/", None, self._unknown)])

    def _respond(self, raw: bytes):
        body = json.loads(raw or b"{}")
        if self.error and self.error_service in (None, body.get("ServiceCode")):
            return self.error[0], {"__type": self.error[1], "Message": "stand-in error"}
        return self.answer(body)

    @staticmethod
    def _unknown(_raw: bytes):
        return 400, {"__type": "UnknownOperationException", "message": "not a GetProducts call"}

    def answer(self, body: dict) -> dict:
        """One GetProducts page for a request body."""
        found = [p for p in self.products if _matches(p, body.get("ServiceCode"), body.get("Filters", []))]
        start = int(body.get("NextToken") or 0)
        size = int(body.get("MaxResults") or 100)
        page = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in found[start : start + size]]}
        if start + size < len(found):
            page["NextToken"] = str(start + size)
        return page
