"""NativeModel.load's speculative_width (helios-serve --speculative-width): load-time
selection may reduce the captured width, never raise it (the specification, "Serving
metadata"). A width the core does not capture is a SpeculativeWidthError before any
resource is read, never ignored."""

from __future__ import annotations

import pytest
from helios_contract import PreparedContract
from helios_ignition.testing import tiny_core
from helios_serve.runtime import NativeModel, RuntimeLoadError, SpeculativeWidthError
from helios_serve.testing.native import load_native


def _load_unread(core, width: int):
    """NativeModel.load of `core` whose resources fail the test when read."""

    def unread(rid: str) -> bytes:
        raise AssertionError(f"resource {rid!r} read before the width was checked")

    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    return NativeModel.load(prepared, unread, "cpu", speculative_width=width)


@pytest.fixture(scope="module")
def plain():
    return tiny_core(1)


@pytest.fixture(scope="module")
def speculative():
    return tiny_core(1, speculative_widths=(1, 2, 4))


def test_a_width_on_a_core_without_speculative_programs_is_refused_before_loading(plain):
    with pytest.raises(SpeculativeWidthError) as info:
        _load_unread(plain, 4)
    assert str(info.value) == ("--speculative-width 4: the core has no speculative programs "
                               "(0 or no option serves plain decode)")
    assert isinstance(info.value, RuntimeLoadError)


def test_a_width_above_the_widest_captured_is_refused_naming_it(speculative):
    with pytest.raises(SpeculativeWidthError) as info:
        _load_unread(speculative, 5)
    assert str(info.value) == ("--speculative-width 5: the core's widest captured "
                               "speculative width is 4 (captured: 1, 2, 4); load-time "
                               "selection may reduce it, never raise it")


@pytest.mark.parametrize("core", ["plain", "speculative"])
def test_a_negative_width_is_refused(core, request):
    with pytest.raises(SpeculativeWidthError) as info:
        _load_unread(request.getfixturevalue(core), -1)
    assert str(info.value) == "--speculative-width -1: must be >= 0 (0 turns speculation off)"


@pytest.mark.parametrize(("width", "served"), [(None, (1, 2, 4)), (4, (1, 2, 4)),
                                               (3, (1, 2)), (2, (1, 2)), (1, ()), (0, ())])
def test_captured_or_narrower_widths_are_served(speculative, width, served):
    model = load_native(speculative, "cpu", speculative_width=width)
    try:
        assert model.manifests.speculative_widths == served
    finally:
        model.close()


def test_zero_or_no_width_serves_plain_decode_on_a_core_without_speculation(plain):
    for width in (None, 0):
        model = load_native(plain, "cpu", speculative_width=width)
        try:
            assert model.manifests.speculative_widths == ()
        finally:
            model.close()
