"""``ConvBlock.writes_in_place``: which blocks may be handed views of stored values."""

from __future__ import annotations

import pytest
from support.models import SkipCat

from hopserve.worker.trace.split import split_model


def _last_block(tail: str):
    return split_model(SkipCat(tail), 6).blocks[-1]


def test_a_block_of_pure_ops_writes_nothing_in_place():
    assert not _last_block("none").writes_in_place
    assert not _last_block("keyword-free").writes_in_place  # an unknown tail: none taken


@pytest.mark.parametrize("tail", ["method", "function", "out", "keyword", "module"])
def test_every_kind_of_in_place_write_is_seen(tail):
    assert _last_block(tail).writes_in_place, tail
