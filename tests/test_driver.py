"""nbjit's driver layer where it needs no GPU: how driver errors are told."""
from __future__ import annotations

import pytest

from nbjit import NbjitLoadError, _driver


def test_sticky_errors_say_what_happened_and_what_to_do():
    for code in (700, 719):  # an illegal address; a launch that failed on the device
        text = _driver.error_text(code)
        assert str(code) in text and text.endswith(f"({_driver.STICKY_HINT})")
    assert "faulted" not in _driver.error_text(1)  # invalid value: nothing sticky about it


def test_a_lookup_fails_as_not_found_only_where_the_driver_did_not_find_it():
    assert _driver._not_found(500, "kernel 'k'") is None  # CUDA_ERROR_NOT_FOUND
    with pytest.raises(NbjitLoadError) as e:
        _driver._not_found(700, "kernel 'k'")
    assert str(e.value).startswith("looking up kernel 'k' failed: ") and _driver.STICKY_HINT in str(e.value)
