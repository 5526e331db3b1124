"""The one way probes replace ``torch.distributed``'s functions (``torch_dist.spies``): the
wrapper is what a learner's call reaches inside the block, and the real function is back after
it, also when the block raises."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d

from course_utils.torch_dist.spies import replaced


def test_the_wrapper_is_in_place_inside_and_the_real_function_after_even_on_an_error():
    real_send, seen = dist.send, []

    def wrap(name, real):
        def spy(*a, **k):
            seen.append(name)
        return spy

    with pytest.raises(ZeroDivisionError):
        with replaced(wrap, ("send", "no_such_function")) as reals:
            assert reals == {"send": real_send}  # a name torch lacks is skipped
            dist.send(None, 1)
            assert distributed_c10d.send is real_send  # only torch.distributed by default
            raise ZeroDivisionError
    assert seen == ["send"] and dist.send is real_send


def test_c10d_gets_the_same_wrapper_that_p2pop_compares_with():
    real = dist.isend
    with replaced(lambda name, fn: lambda *a, **k: fn(*a, **k), ("isend",), c10d=True):
        assert dist.isend is distributed_c10d.isend is not real  # (test_unit11 sends with it)
    assert dist.isend is distributed_c10d.isend is real
