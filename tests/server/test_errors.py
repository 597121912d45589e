"""The front-end's error table: client values are quoted short, messages are bounded."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from hopserve.rpc import MAX_STATUS_BYTES, bound_message, clip, quote
from hopserve.server.errors import InvalidRequestError, ModelNotFoundError, format_ids, to_status
from hopserve.worker.graph.errors import UnknownNodeError


def test_quote_keeps_64_characters_and_the_size() -> None:
    assert quote("sage") == "'sage'"
    assert quote("x" * 64) == repr("x" * 64)
    assert quote("x" * 100_000) == repr("x" * 64) + "…(100000 bytes)"
    assert quote("ü" * 65) == repr("ü" * 64) + "…(130 bytes)"  # UTF-8 size
    assert quote("a\x00\x1b[31m\n") == "'a\\x00\\x1b[31m\\n'"  # control characters escaped
    assert quote(12) == "'12'"


def test_clip_leaves_short_printable_values_alone() -> None:
    assert clip("sage-17") == "sage-17"
    assert clip("a\nb") == "'a\\nb'"
    assert clip("j" * 1000) == repr("j" * 64) + "…(1000 bytes)"


@pytest.mark.parametrize("text", ["", "short", "é" * 10_000, "x" * 5000, "😀" * 700])
def test_bound_message_fits_the_limit(text: str) -> None:
    out = bound_message(text)
    assert len(out.encode()) <= MAX_STATUS_BYTES
    if len(text.encode()) <= MAX_STATUS_BYTES:
        assert out == text
    else:
        assert out.endswith(f"…(truncated, {len(text.encode())} bytes)")
        assert text.startswith(out.split("…(truncated")[0])


def test_every_status_message_is_bounded() -> None:
    huge = "m" * 100_000
    for exc in (
        ModelNotFoundError(f"model {huge!r} not found"),  # a message built without quote()
        InvalidRequestError("ü" * 100_000),
        UnknownNodeError(np.arange(10_000), 10_000),
    ):
        code, message = to_status(exc)
        assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
        assert len(message.encode()) <= MAX_STATUS_BYTES


def test_format_ids_names_ten() -> None:
    assert format_ids(range(25)) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (15 more)"
