"""Unit 1's pure helpers: the ring schedule and the deadlock (data and pictures), the route
diagnosis of a ring checked on more than 2 ranks, the byte checks, and the simulated two-host
rank map the graded checks of units 0 and 1 run on. No cluster: these are pure functions."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from matplotlib.text import Text  # noqa: E402

from course_utils.checks import collective_calls, ring_allreduce  # noqa: E402
from course_utils.checks.spawn import simulated_rank_map  # noqa: E402
from course_utils.torch_dist.p2p import chunk_bounds  # noqa: E402
from course_utils.viz.collectives import ring_schedule, ring_schedule_picture  # noqa: E402
from course_utils.viz.pictures import blocking_ring, deadlock_picture  # noqa: E402


def texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(Text))


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ring_schedule_reduce_scatter_then_all_gather(p):
    steps = ring_schedule(p)
    assert [s["phase"] for s in steps] == ["start"] + ["reduce-scatter"] * (p - 1) + \
        ["all-gather"] * (p - 1)
    everyone = list(range(p))
    for st in steps[1:]:
        # every rank sends exactly one chunk, to its right neighbour, every step
        assert sorted(src for src, _, _ in st["moves"]) == everyone
        assert all(dst == (src + 1) % p for src, dst, _ in st["moves"])
    after_rs = steps[p - 1]["held"]
    for r in range(p):   # after reduce-scatter rank r holds the full sum of chunk r + 1
        assert after_rs[r][(r + 1) % p] == everyone
        assert sum(after_rs[r][c] == everyone for c in range(p)) == 1
    assert all(c == everyone for row in steps[-1]["held"] for c in row)


def test_ring_schedule_moves_are_the_lesson_formulas():
    p = 4
    steps = ring_schedule(p)
    for s in range(p - 1):
        assert [c for _, _, c in steps[1 + s]["moves"]] == [(r - s) % p for r in range(p)]
        assert [c for _, _, c in steps[p + s]["moves"]] == [(r + 1 - s) % p for r in range(p)]
    # the graded checks' schedule agrees with the picture's
    for r in range(p):
        sent = [dict((src, c) for src, _, c in st["moves"])[r] for st in steps[1:]]
        assert sent == ring_allreduce.ring_schedule_chunks(r, p)


def test_ring_schedule_needs_two_ranks():
    with pytest.raises(ValueError, match="p >= 2"):
        ring_schedule(1)


def test_ring_schedule_picture_labels_steps_and_sums(tmp_path):
    fig = ring_schedule_picture(4)
    words = texts(fig)
    assert "reduce-scatter step 2" in words and "all-gather step 0" in words
    assert "Σ" in words and "0+3" in words and "←r3" in words
    fig.savefig(tmp_path / "ring.png", dpi=50)
    assert (tmp_path / "ring.png").stat().st_size > 5000


def test_blocking_ring_send_first_everywhere_deadlocks():
    for p in (2, 3, 4):
        state = blocking_ring(p)
        assert [s["stuck_in"] for s in state] == ["send"] * p
        assert [s["waits_for"] for s in state] == [(r + 1) % p for r in range(p)]


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_blocking_ring_even_send_odd_receive_finishes(p):
    state = blocking_ring(p, [r % 2 == 0 for r in range(p)])
    assert all(s["stuck_in"] is None for s in state)


def test_deadlock_picture_marks_stuck_sends(tmp_path):
    words = texts(deadlock_picture(2))
    assert words.count("waits here") == 2 and words.count("never reached") == 2
    assert "deadlock" in words
    assert "no deadlock" in texts(deadlock_picture(2, [True, False]))


def test_simulated_rank_map_two_hosts():
    ranks = simulated_rank_map((2, 2))
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    assert [r["host"] for r in ranks] == ["host0", "host0", "host1", "host1"]
    assert {r["master_addr"] for r in ranks} == {"127.0.0.1"}


def _results(p: int, n: int, routes: dict[int, list[tuple[int, int]]], local=None):
    return [{"rank": r, "n": n, "routes": routes[r],
             "local_rank": (local or list(range(p)))[r]} for r in range(p)]


def _ring_routes(p: int, n: int, dst, chunks) -> dict[int, list[tuple[int, int]]]:
    starts = [a for a, _ in chunk_bounds(n, p)]
    return {r: [(dst(r), starts[c]) for c in chunks(r)] for r in range(p)}


def test_route_hint_is_silent_for_the_ring():
    p, n = 4, 12
    routes = _ring_routes(p, n, lambda r: (r + 1) % p,
                          lambda r: ring_allreduce.ring_schedule_chunks(r, p))
    assert ring_allreduce.ring_route_hint(_results(p, n, routes)) == ""


def test_route_hint_names_a_ring_that_ignores_the_step():
    p, n = 4, 12
    routes = _ring_routes(p, n, lambda r: (r + 1) % p,
                          lambda r: [r] * (p - 1) + [(r + 1) % p] * (p - 1))
    hint = ring_allreduce.ring_route_hint(_results(p, n, routes))
    assert "The chunk must move with the step" in hint


def test_route_hint_names_sending_left():
    p, n = 3, 12
    routes = _ring_routes(p, n, lambda r: (r - 1) % p,
                          lambda r: ring_allreduce.ring_schedule_chunks(r, p))
    assert "send to the right" in ring_allreduce.ring_route_hint(_results(p, n, routes))


def test_route_hint_says_nothing_of_left_and_right_on_two_ranks():
    # with 2 ranks (r - 1) % 2 == (r + 1) % 2: a right ring and a left one send alike
    p, n = 2, 12
    routes = _ring_routes(p, n, lambda r: (r - 1) % p,
                          lambda r: ring_allreduce.ring_schedule_chunks(r, p))
    assert ring_allreduce.ring_route_hint(_results(p, n, routes)) == ""


def test_route_hint_names_local_rank():
    p, n, local = 4, 12, [0, 1, 0, 1]
    routes = _ring_routes(p, n, lambda r: (local[r] + 1) % p,
                          lambda r: ring_allreduce.ring_schedule_chunks(local[r], p))
    hint = ring_allreduce.ring_route_hint(_results(p, n, routes, local))
    assert "Use rank, the global rank" in hint


def _bytes_results(p: int, n: int, sent: list[int], messages: list[list[int]]):
    return [{"rank": r, "n": n, "itemsize": 4, "bytes_sent": sent[r], "messages": messages[r]}
            for r in range(p)]


def test_ring_bytes_problem_accepts_a_ring_and_names_whole_buffers():
    p, n = 3, 12
    chunk = 4 * 4
    ok = _bytes_results(p, n, [4 * chunk] * p, [[chunk] * 4] * p)
    assert ring_allreduce.ring_bytes_problem(ok) is None
    whole = _bytes_results(p, n, [2 * n * 4] * p, [[n * 4] * 2] * p)
    assert "2(p-1) buffers" in ring_allreduce.ring_bytes_problem(whole)
    big = _bytes_results(p, n, [4 * chunk] * p, [[2 * chunk, 2 * chunk]] * p)
    assert "each step may move one chunk" in ring_allreduce.ring_bytes_problem(big)


def test_local_rank_problem_only_where_they_differ():
    two = simulated_rank_map((2, 2))
    assert "use rank, not local_rank" in collective_calls.local_rank_problem(
        [0, 1, 0, 1], two, "the rank each join claimed")
    assert collective_calls.local_rank_problem([0, 1, 2, 3], two, "claims") is None
    one = simulated_rank_map((2,))
    assert collective_calls.local_rank_problem([0, 1], one, "claims") is None
