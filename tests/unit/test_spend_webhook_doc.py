"""docs/admin-api.md's webhook receiver check ("Threshold alerts"), run as printed against what
the alerts loop signs (ezat_compat/alerts.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ezat_compat.alerts import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from tests.support.docs import code_block

PAGE = Path(__file__).resolve().parents[2] / "docs" / "admin-api.md"


def test_the_documented_receiver_check_accepts_our_signature_and_nothing_else() -> None:
    namespace: dict[str, Any] = {}
    exec(code_block(PAGE, "python", "def verified"), namespace)  # the page's own example
    verified = namespace["verified"]
    body = b'{"type":"spend_limit.threshold_reached"}'
    now = int(time.time())
    headers = {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: sign("s3cret", now, body)}
    assert verified("s3cret", headers, body)
    assert not verified("other", headers, body)
    assert not verified("s3cret", headers, body + b"x")
    old = now - 3600
    assert not verified("s3cret", {TIMESTAMP_HEADER: str(old), SIGNATURE_HEADER: sign("s3cret", old, body)}, body)
