"""uvicorn as `ptctl serve` runs it: `uvicorn_config(app, settings)` (the tests use it too).

A request head (request line + headers) over `PTCTL_MAX_HEADER_BYTES` is refused with 431 by the HTTP
parser itself. Where the time went without it: httptools grows a header value by concatenating each
chunk the socket delivers, so a 100 MB `Authorization` header cost ~11 s of event-loop time (quadratic)
before the app, let alone auth, saw it; 10 MB cost 0.09 s. `HeaderLimitedProtocol` feeds the parser at most
the limit's worth of head and answers 431 past it, in microseconds. (h11 has `h11_max_incomplete_event_size`
for the same purpose, set here too, but answers 400 and parses in Python.)
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings


class HeaderLimitedProtocol(HttpToolsProtocol):
    """httptools' protocol with a cap on the bytes of each request's head."""

    max_head_bytes = 16384  # set per server by `uvicorn_config`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head, self._head_bytes = True, 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # the next request on this connection starts its head

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            return super().data_received(data)
        room = self.max_head_bytes - self._head_bytes
        head, rest = data[:room], data[room:]
        self._head_bytes += len(head)
        super().data_received(head)
        if rest and not self.transport.is_closing():
            if self._in_head:
                return self._refuse()
            super().data_received(rest)

    def _refuse(self) -> None:
        body = json.dumps({"detail": f"request headers over {self.max_head_bytes} bytes (PTCTL_MAX_HEADER_BYTES): "
                                     "send fewer or shorter headers"}).encode()
        self.logger.warning("refused a request head over %d bytes (431)", self.max_head_bytes)
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        self.transport.close()


def uvicorn_config(app: FastAPI, settings: Settings, **options: Any) -> uvicorn.Config:
    """The uvicorn config of `app` on `settings.host`:`settings.port`, with the head limit; `options` pass through."""
    limit = settings.limits.header_bytes
    protocol = type("Protocol", (HeaderLimitedProtocol,), {"max_head_bytes": limit})
    return uvicorn.Config(app, host=settings.host, port=settings.port, http=protocol,
                          h11_max_incomplete_event_size=limit, server_header=False, **options)
