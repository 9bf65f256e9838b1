"""URLs as they may be shown: without their query, which in a presigned URL
(``X-Amz-Signature``, ``X-Goog-Signature``, a SAS ``sig``) is a credential until it expires."""
from __future__ import annotations

from tpunb.engine.masking import MIN_LENGTH


def bare(url: str) -> str:
    """``url`` without its query and fragment."""
    return url.split("?", 1)[0].split("#", 1)[0]


def query(url: str) -> str | None:
    """The query of ``url`` when it is long enough to mask (None otherwise)."""
    if "?" not in url:
        return None
    found = url.split("?", 1)[1].split("#", 1)[0]
    return found if len(found) >= MIN_LENGTH else None
