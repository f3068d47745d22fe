"""Export reads weights ahead of the writer (helios_ignition.export.read_ahead)."""

from __future__ import annotations

import pytest
from helios_ignition.export import read_ahead


def test_read_ahead_keeps_order_and_raises_where_the_producer_failed():
    assert list(read_ahead(iter(range(10)))) == list(range(10))
    def failing():
        yield 1
        yield 2
        raise ValueError("bad tensor")
    got = []
    with pytest.raises(ValueError, match="bad tensor"):
        for x in read_ahead(failing()):
            got.append(x)
    assert got == [1, 2]

def test_read_ahead_stops_its_producer_when_the_consumer_leaves():
    produced = []
    def many():
        for i in range(1000):
            produced.append(i)
            yield i
    gen = read_ahead(many(), depth=2)
    assert next(gen) == 0
    gen.close()
    assert len(produced) <= 5
