"""The concurrency rules helios-serve's settings and `helios-tools inspect` share:
default_max_active (core defaults fill a missing --max-active) and request_slots."""

from __future__ import annotations

import pytest
from helios_contract.prepared import default_max_active, request_slots

from tests.contract.example import SLOTS, example_contract, example_manifest


def test_default_max_active_prefers_the_serving_default():
    serving = example_contract()
    serving.defaults.max_active, serving.selected_concurrency = 3, 4
    assert default_max_active(serving) == 3
    serving.defaults.max_active = 0  # no serving default: the selected concurrency
    assert default_max_active(serving) == 4
    serving.selected_concurrency = 0
    assert default_max_active(serving) == 0


def test_request_slots_are_the_fewest_page_table_rows():
    serving, manifest = example_contract(), example_manifest()
    assert request_slots(serving, manifest) == SLOTS
    (table,) = [b for b in manifest.buffers if b.name == "page_table"]
    table.shape[0] = SLOTS - 1
    assert request_slots(serving, manifest) == SLOTS - 1
    del serving.model.cache.page_table_views[:]
    assert request_slots(serving, manifest) == 0
    serving = example_contract()
    serving.model.cache.page_table_views[0].buffer = "absent"
    with pytest.raises(KeyError):
        request_slots(serving, manifest)
