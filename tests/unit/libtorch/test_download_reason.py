"""What a failed download says about the failure: urllib3's cause, without requests' and urllib3's wrappers,
never cut in the middle of a word (issue 38 item 11)."""

from __future__ import annotations

import requests
import urllib3.exceptions
from urllib3.connection import HTTPSConnection

from fdl.libtorch.install import _reason


def wrapped(cause: BaseException) -> requests.exceptions.ConnectionError:
    """What requests raises: its ConnectionError around urllib3's MaxRetryError around the cause."""
    retry = urllib3.exceptions.MaxRetryError(None, "/libtorch/cpu/libtorch.zip", reason=cause)  # type: ignore[arg-type]
    return requests.exceptions.ConnectionError(retry)


def test_the_cause_is_named_without_the_wrappers() -> None:
    conn = HTTPSConnection("download.pytorch.org", 443)
    cause = urllib3.exceptions.NameResolutionError("download.pytorch.org", conn, OSError("no DNS answer"))
    assert _reason(wrapped(cause)) == "Failed to resolve 'download.pytorch.org' (no DNS answer)"


def test_a_long_cause_is_cut_at_a_word() -> None:
    conn = HTTPSConnection("mirror.example", 443)
    words = [f"word{i}" for i in range(80)]
    cause = urllib3.exceptions.NewConnectionError(conn, " ".join(words))
    text = _reason(wrapped(cause), limit=120)
    assert text.endswith(" ...") and len(text) <= 124
    assert set(text.removesuffix(" ...").split()) <= set(words)
    assert _reason(requests.exceptions.ReadTimeout("read timed out")) == "read timed out"
