"""AWS event-stream framing as Bedrock's InvokeModelWithResponseStream writes it (pure).

One message: total length and headers length (big-endian 32-bit), the CRC-32 of those eight
bytes, the headers (each a one-byte name length, the name, type 7 for a string, a two-byte
value length, the value), the payload, and the CRC-32 of everything before it (AWS, "Event
stream encoding"; botocore's ``botocore/eventstream.py`` decodes it).

Bedrock's response stream (botocore's ``bedrock-runtime`` service model, ``ResponseStream``):
each Anthropic stream event is a ``chunk`` event whose payload is ``{"bytes": "<base64 of the
event's JSON>"}`` (``PayloadPart``); a failure is an ``exception`` message whose
``:exception-type`` names it in lowerCamelCase (``throttlingException``…) with
``{"message": …}`` as its payload.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Mapping

STRING_HEADER = 7  # the header value type of a UTF-8 string
CHUNK_HEADERS = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return struct.pack("!B", len(raw_name)) + raw_name + struct.pack("!BH", STRING_HEADER, len(raw_value)) + raw_value


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message of string ``headers`` and ``payload``."""
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    prelude = struct.pack("!II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + encoded + payload
    return message + struct.pack("!I", zlib.crc32(message))


def chunk_message(event_json: bytes) -> bytes:
    """An Anthropic stream event's JSON (its ``data``) as Bedrock's ``chunk`` event."""
    payload = b'{"bytes":"' + base64.b64encode(event_json) + b'"}'
    return encode_message(CHUNK_HEADERS, payload)


def exception_message(kind: str, message: str) -> bytes:
    """A stream's ``exception`` message: ``kind`` in Bedrock's lowerCamelCase spelling."""
    return encode_message(
        {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"},
        json.dumps({"message": message}, ensure_ascii=False).encode(),
    )
