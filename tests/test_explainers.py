"""The pure explainers behind units 0-2's test messages: every message says what was checked,
expected, found and what to try, and names the mistake it recognises."""

from __future__ import annotations

from course_utils import checks, join_watch

URL = ("127.0.0.1", 5000)


def is_feedback(msg: str | None) -> bool:
    return bool(msg) and all(k in msg for k in ("checked:", "expected:", "found:", "try:"))


def test_feedback_format():
    msg = checks.feedback("a", "b", "c", "d")
    assert msg == "checked:  a\nexpected: b\nfound:    c\ntry:      d" and is_feedback(msg)


# ---- unit 0: join_watch --------------------------------------------------------------------
def outcome(rank, claim=None, error=None, group=True, returned=2.0, timeout_s=5.0,
            method="tcp://127.0.0.1:5000", world=2):
    claims = [] if claim is None else [{"rank": claim, "world_size": world, "backend": "gloo",
                                        "init_method": method, "timeout_s": timeout_s}]
    g = {"rank": rank, "world_size": 2, "backend": "gloo", "init_method": method} if group else None
    return {"rank": rank, "claims": claims, "error": error, "seconds": 0.1, "returned": returned,
            "group": g}


def test_explain_join_accepts_a_right_group():
    assert join_watch.explain_join([outcome(0, 0), outcome(1, 1)], *URL, timeout_s=5) is None


def test_explain_join_names_two_ranks_claiming_rank_0_with_torchs_errors():
    msg = join_watch.explain_join([
        outcome(0, 0, "DistStoreError: Timed out after 6 seconds waiting for clients.", False),
        outcome(1, 0, "DistNetworkError: ... EADDRINUSE ...", False)], *URL, timeout_s=5)
    assert is_feedback(msg) and "two ranks claimed rank 0" in msg
    assert "nobody claimed rank 1" in msg and "EADDRINUSE" in msg and "rank=rank" in msg


def test_explain_join_other_mistakes():
    def why(*outs, **kw):
        return join_watch.explain_join(list(outs), *URL, **kw)

    assert "never called dist.init_process_group" in why(
        outcome(0, error="NotImplementedError: "), outcome(1, error="NotImplementedError: "))
    assert "rank-map rank 0 claimed rank 1" in why(outcome(0, 1), outcome(1, 0))
    assert "world sizes [3]" in why(outcome(0, 0, world=3), outcome(1, 1, world=3))
    nobackend = [outcome(0, 0), outcome(1, 1)]
    for o in nobackend:
        o["claims"][0]["backend"] = "None"
    assert "backends ['None']" in why(*nobackend) and 'backend="gloo"' in why(*nobackend)
    assert "tcp://127.0.0.1:23456" in why(outcome(0, 0, method="tcp://127.0.0.1:23456"),
                                          outcome(1, 1, method="tcp://127.0.0.1:23456"))
    assert "timeout=datetime.timedelta" in why(outcome(0, 0, timeout_s=None),
                                               outcome(1, 1, timeout_s=None), timeout_s=5)
    assert "no group on ranks [0, 1]" in why(outcome(0, 0, group=False),
                                             outcome(1, 1, group=False))
    assert "returned [None, None]" in why(outcome(0, 0, returned=None),
                                          outcome(1, 1, returned=None))
    assert "ValueError" in why(outcome(0, 0, error="ValueError: x"), outcome(1, 1))


# ---- unit 1: the ring ----------------------------------------------------------------------
def ring(rank, n=7, **kw):
    out = {"rank": rank, "n": n, "itemsize": 4, "error": None, "error_line": "", "stuck": None,
           "bytes_sent": 28, "max_abs_diff": 0.0, "worst_index": 0, "tol": 1e-5,
           "messages": [16, 12], "checksum": 1.0}
    out.update(kw)
    return out


def stuck(call, peer):
    return {"rank": 0, "call": call, "peer": peer, "bytes": 4, "number": 1, "seconds": 5.0}


def test_ring_problem_accepts_a_right_ring():
    assert checks.ring_problem([ring(0), ring(1)]) is None


def test_ring_problem_names_a_send_recv_deadlock_and_the_restart():
    msg = checks.ring_problem([ring(0, stuck=stuck("send", 1)), ring(1, stuck=stuck("send", 0))])
    assert is_feedback(msg) and "send/recv deadlock" in msg and "isend" in msg
    assert "cu.restart()" in msg and "any message size" in msg


def test_ring_problem_other_failures():
    waiting = checks.ring_problem([ring(0, stuck=stuck("irecv", 1)), ring(1)])
    assert "waiting for a message that never came" in waiting and "deadlock" not in waiting
    err = checks.ring_problem([ring(0, n=1, error="IndexError: list index out of range",
                                    error_line="line 9 of your cell: a = b[2]"),
                               ring(1, n=1, stuck=stuck("recv", 0))])
    assert "IndexError" in err and "line 9 of your cell" in err and "n=1 < p=2" in err
    assert "cu.restart()" in err
    cheat = checks.ring_problem([ring(0, error="RuntimeError: this exercise builds all-reduce "
                                               "from isend/irecv only"), ring(1)])
    assert "isend/irecv only" in cheat and "no dist.all_reduce" in cheat
    wrong = checks.ring_problem([ring(0, max_abs_diff=3.0), ring(1)])
    assert "rank 0 differs by 3" in wrong and "n=7 does not divide" in wrong
    apart = checks.ring_problem([ring(0, checksum=1.0), ring(1, checksum=2.0)])
    assert "the same result on every rank" in apart


# ---- unit 2: the data-parallel step --------------------------------------------------------
def dp(rank, step1="right", step2="right", losses=(1.0, 0.9), ref=(1.0, 0.9), error=None):
    return {"rank": rank, "world_size": 2, "error": error, "step1": step1, "step2": step2,
            "losses": list(losses), "reference_losses": list(ref),
            "loss_types": [type(v).__name__ for v in losses]}


def test_dp_step_problem_names_each_mistake():
    assert checks.dp_step_problem([dp(0), dp(1)]) is None
    cases = {
        "summed": "divide each parameter's .grad by world_size",
        "local": "all_reduce(loss) after step() exchanges nothing",
        "unchanged": "the weights did not change",
        "other": "in that order",
    }
    for verdict, words in cases.items():
        msg = checks.dp_step_problem([dp(0, step1=verdict), dp(1, step1=verdict)])
        assert is_feedback(msg) and words in msg, (verdict, msg)
    piled = checks.dp_step_problem([dp(0, step2="accumulated"), dp(1, step2="accumulated")])
    assert "opt.zero_grad()" in piled and "pile up" in piled
    assert "raised ValueError" in checks.dp_step_problem([dp(0, error="ValueError: x"), dp(1)])
    summed_loss = checks.dp_step_problem([dp(0, losses=(2.0, 1.8)), dp(1)])
    assert "world_size times too large" in summed_loss
    tensor_loss = [dp(0), dp(1)]
    tensor_loss[0]["loss_types"] = ["Tensor", "Tensor"]
    assert "Python float" in checks.dp_step_problem(tensor_loss)
