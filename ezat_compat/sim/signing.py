"""Thinking-block signatures the simulator can verify.

The real API signs every ``thinking`` block it emits and refuses a block whose ``signature``
it cannot verify ("Invalid `signature` in `thinking` block"). The simulator does the same
with an HMAC-SHA256 of the block's ``thinking`` text under a fixed simulator secret, so a
block it emitted verifies when sent back unmodified and any edit, invented block or block
from elsewhere does not. Signatures are compared as UTF-8 bytes, so any string a client sends
(non-ASCII, a lone surrogate from a ``\\ud800`` escape) is just an invalid signature: a 400
like the real API's, never an error of the simulator's own.

One secret for every provider the simulator speaks: "signature values are compatible across
platforms (Claude APIs, Amazon Bedrock, and Google Cloud). Values generated on one platform work
on another" (https://platform.claude.com/docs/en/build-with-claude/extended-thinking), so a block
signed while speaking Bedrock verifies while speaking Vertex, as the real platforms do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SIM_THINKING_SECRET = b"ezat-sim thinking signature v1"
SIGNATURE_PREFIX = "simsig1_"


def sign_thinking(text: str) -> str:
    """The signature the simulator puts on a ``thinking`` block with this ``thinking`` text."""
    digest = hmac.new(SIM_THINKING_SECRET, _utf8(text), hashlib.sha256).digest()
    return SIGNATURE_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def verify_thinking(text: str, signature: str) -> bool:
    """True when ``signature`` is what ``sign_thinking(text)`` gives (compared as bytes:
    ``hmac.compare_digest`` refuses non-ASCII strings)."""
    return hmac.compare_digest(_utf8(sign_thinking(text)), _utf8(signature))


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate (JSON allows ``\\ud800``) encoded as it is."""
    return text.encode("utf-8", "surrogatepass")
