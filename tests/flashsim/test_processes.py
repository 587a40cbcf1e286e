"""flashsim.analysis.processes: calls in worker processes come back in order; what a call prints does not reach
the results; a failing call or a dying worker is an error naming the call, with the worker's traceback."""

import math
import os

import pytest

from flashsim.analysis.processes import in_processes


def test_results_in_order_and_prints_kept_out_of_them():
    calls = [(k,) for k in range(7)]
    assert list(in_processes(math.factorial, calls, 3)) == [math.factorial(k) for k in range(7)]
    assert list(in_processes(print, [("to stderr",), ("again",)], 2)) == [None, None]  # print's None, intact
    assert list(in_processes(math.factorial, [], 2)) == []


def test_a_failing_call_names_itself_with_the_workers_traceback():
    with pytest.raises(RuntimeError, match=r"call 2 of 3 failed in its worker:(.|\n)*ValueError"):
        list(in_processes(math.factorial, [(3,), (-1,), (4,)], 2))


def test_a_dying_worker_is_an_error():
    with pytest.raises(RuntimeError, match=r"worker of call 1 of 1 died \(exit 3\)"):
        list(in_processes(os._exit, [(3,)], 1))
