"""moto's S3 server with ranged GETs that read only their range: ``python -m tests.support.moto_ranges -H
127.0.0.1 -p PORT`` (moto's own arguments).

moto builds every GET's body from the whole object and slices the range out of it afterwards, so one ranged
GET of 64 KiB costs 72 ms from a 106 MiB object and 4.6 ms from a 14 KiB one (``benchmarks/remote_restore``
measures it in every run). S3's ranged GETs do not cost more for larger objects, and a benchmark of range
reads would otherwise time moto. Here a GET whose ``Range`` is one ``bytes=a-b`` hands moto's range code a
body that reads just the bytes it slices; everything else (headers, checksums, errors) is moto's.
"""

from __future__ import annotations

import sys


class _RangedBody:
    """An object's bytes as moto's range code uses them (its length, one slice), read from the key's buffer."""

    def __init__(self, key):
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __bool__(self) -> bool:
        return self.key.size > 0

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(self.key.size)
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


def patch() -> None:
    import threading

    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    ranged = threading.local()
    whole = FakeKey.value

    def value(self):
        return _RangedBody(self) if getattr(ranged, "on", False) else whole.fget(self)

    get_object = S3Response.get_object

    def ranged_get_object(self):
        header = self.headers.get("range") or ""
        ranged.on = header.startswith("bytes=") and "," not in header and "partNumber" not in self.querystring
        try:
            return get_object(self)
        finally:
            ranged.on = False

    FakeKey.value = property(value, whole.fset)
    S3Response.get_object = ranged_get_object


if __name__ == "__main__":
    patch()
    from moto.server import main
    from werkzeug.serving import WSGIRequestHandler

    # replies go out in pieces (headers, then the body): without this a keep-alive client's delayed ACK holds
    # the body back 40 ms (Nagle's algorithm), a wait S3 does not have
    WSGIRequestHandler.disable_nagle_algorithm = True

    main(sys.argv[1:])
