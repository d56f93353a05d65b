"""What a test process holds for its whole life, out of the cyclic collector's way.

A test process loads the package, its libraries and every test module, and some load the SDKs
(whose pydantic validators are large object graphs). Each full collection walks all of it again,
and the last one, at the process's exit, walks the SDKs' validators for seconds (2 s of a 20 s
``pytest tests/unit`` here, after the last test): work no test measures. ``gc.freeze()`` moves
what the process holds to the collector's permanent generation, as the server does with the loaded
app before its first request (``server/serving.py``): frozen objects are never walked again and
cyclic garbage among them is never freed (memory the process returns when it ends)."""

from __future__ import annotations

import gc


def freeze_what_is_loaded() -> None:
    """Freeze every object the process holds now (``gc.freeze``): call it once what it loaded
    will stay for the process's life (collection's modules; an SDK's types once imported)."""
    gc.freeze()
