"""The image step's limits, its errors, and the reasons a refusal gives, in the spec's words.

Chat Completions reference, "Images and PDFs": 10 MB per image, 20 image URLs and 32 MB of
downloads per request, 15 seconds per download (redirects included), 3 redirects; the host
must be a public address; the file must be a JPEG, PNG, GIF or WebP image, judged by its bytes.

``ImageFetchError`` is what ``ImageFetcher.fetch_all`` raises; ``Refused`` and ``Cancelled`` are
how the download, the budget and the fitting layers end a download early (the fetcher turns them
into ``ImageFetchError``, or drops a ``Cancelled`` one: nobody waits for it). Every text a
client can read is defined here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True)
class ImageLimits:
    """Per-request limits of "Images and PDFs"; the defaults are the spec's numbers."""

    max_image_bytes: int = 10 * MB
    max_urls: int = 20
    max_total_bytes: int = 32 * MB
    timeout_s: float = 15.0  # wall clock for the whole download, redirects included
    max_redirects: int = 3


class ImageFetchError(Exception):
    """Image URL number ``index`` of the batch can't be used; ``reason`` says why, in the spec's words.

    The client's request is at fault (or the image host): answer 400 with
    ``f"{path_of_url[index]}: {reason}"`` (an ``InvalidRequestError``). Retrying the same
    request as is won't help, except after a timeout or a failed connection.
    """

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"image URL {index}: {reason}")
        self.index = index
        self.reason = reason


class Refused(Exception):
    """A download failed with a client-facing ``reason`` (internal; becomes ImageFetchError)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Cancelled(Exception):
    """The batch was stopped (another download failed, or the deadline passed): nobody waits."""


# ---------------------------------------------------------------- reasons (the spec's texts)


def plain_number(value: float) -> str:
    """``15.0`` -> ``15``, ``0.5`` -> ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def could_not(why: str) -> str:
    return f"could not download the image ({why})"


CONNECTION_FAILED = could_not("connection failed")
NOT_RESOLVED = could_not("the host name could not be resolved")
NOT_HTTP = could_not("only http and https URLs are supported")
NOT_PUBLIC = could_not("the host is not a public address")
INVALID_URL = could_not("the URL is not valid")
UNEXPECTED = could_not("unexpected error")
NOT_AN_IMAGE = "the file is not a JPEG, PNG, GIF or WebP image"
NOT_A_PDF = "the file is not a PDF"


def pdf_reason(reason: str) -> str:
    """A download's ``reason`` for a PDF URL (the same rules as an image URL's): what it says
    of "the image" it says of the PDF."""
    return (
        reason.replace("the image downloads", "the downloads")
        .replace("the image", "the PDF")
        .replace("image URLs", "file URLs")
    )


def timed_out(limits: ImageLimits) -> str:
    return could_not(f"timed out after {plain_number(limits.timeout_s)} s")


def timed_out_waiting(limits: ImageLimits, why: str) -> str:
    return could_not(f"timed out after {plain_number(limits.timeout_s)} s waiting for {why}")


ORG_BUSY = "this organization's other image downloads"
POOL_BUSY = "a free download slot"


def too_many_redirects(limits: ImageLimits) -> str:
    return could_not(f"more than {limits.max_redirects} redirects")


def too_large(limits: ImageLimits) -> str:
    return f"the image is larger than {plain_number(limits.max_image_bytes / MB)} MB"


def too_many_urls(limits: ImageLimits) -> str:
    return f"too many image URLs (at most {limits.max_urls} per request)"


def over_total(limits: ImageLimits) -> str:
    return f"the image downloads of this request exceed {plain_number(limits.max_total_bytes / MB)} MB in total"
