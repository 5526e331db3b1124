"""Pure tests of what a learner reads when engine code fails, and of the small helpers behind
the shared-cluster, exposure and packaging fixes. The texts are real: recorded from torch 2.14,
ipyparallel 9.2 and faulthandler on this course's engines."""

from __future__ import annotations

import sys

import pytest

from course_utils import settings
from course_utils.cluster.engines import engine
from course_utils.cluster.kernel import exposure, failures, sharing
from course_utils.cluster.kernel.failures import Failure
from course_utils.errors import CollectiveMismatch, EngineError, ProcessGroupGone
from course_utils.torch_dist import messages
from course_utils.torch_dist import process_group as pg

# IPython's verbose traceback as an engine sends it (colours stripped, shortened).
TB = """---------------------------------------------------------------------------
ZeroDivisionError                         Traceback (most recent call last)
File /venv/lib/python3.11/site-packages/ipyparallel/engine/kernel.py:157, in do_apply(self)
    155 code = f"{resultname} = {fname}(*{argname}, **{kwargname})"
    156 try:
--> 157     exec(code, shell.user_global_ns, shell.user_ns)
    158     result = working.get(resultname)

File <string>:1
----> 1 'Could not get source, probably due dynamically evaluated source code.'

File /work/course/course_utils/cluster/engines/engine.py:72, in call_named(name, args, kwargs)
---> 72 return fn(*args, **kwargs)

Cell In[1], line 6, in learner_step(x)
      5 def learner_step(x):
----> 6     return scale(x) + 1

Cell In[1], line 3, in scale(x)
      2     y = x * 2
----> 3     return y / (rank - rank)

ZeroDivisionError: division by zero"""

MISMATCH_0 = (
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[2, 2], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, "
    "layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), "
    "memory_format=(nullopt))), but Rank 1 is running collective: CollectiveFingerPrint("
    "SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[3, 2], TensorDtypes=Float, "
    "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided "
    "(default), requires_grad=false (default), pinned_memory=false (default), "
    "memory_format=(nullopt))).Collectives differ in the following aspects: "
    "  Tensor Tensor shapes: 2 2vs 3 2")
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129]"
                " Timed out waiting 5000ms for send operation to complete")
GLOO_GONE = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection "
             "closed by peer [127.0.0.1]:56488. This is typically caused by a remote worker "
             "crashing.")
BARRIER = ("ProcessGroupWrapper: Monitored Barrier encountered error running collective: "
           "CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE). Error: \n Rank 1 failed "
           "to pass monitoredBarrier in 2000 ms")
FAULTHANDLER = """Thread 0x00007f1c8a7fc6c0 (most recent call first):
  File "/venv/lib/python3.11/site-packages/zmq/sugar/socket.py", line 300 in poll
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f1ca0a3b740 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 39 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/ipykernel_4242/1234.py", line 9 in only_rank0_reduces
  File "<string>", line 1 in <module>
  File "/venv/lib/python3.11/site-packages/ipyparallel/engine/kernel.py", line 157 in do_apply
"""


def test_frames_keep_only_the_learners_lines():
    shown = failures.learner_frames(TB)
    assert [f.text() for f in shown] == [
        "Cell In[1], line 6, in learner_step: return scale(x) + 1",
        "Cell In[1], line 3, in scale: return y / (rank - rank)",
    ]
    assert len(failures.frames(TB)) == 5
    plain = 'Traceback:\n  File "/home/me/mine.py", line 4, in f\n    return 1 / 0\n'
    assert failures.learner_frames(plain)[0].text() == "mine.py, line 4, in f: return 1 / 0"


def test_rank_lists_group_runs():
    assert failures.rank_list([3, 0, 1, 2]) == "ranks 0-3"
    assert failures.rank_list([0, 2, 5, 6]) == "ranks 0, 2, 5-6"
    assert failures.rank_list([4]) == "rank 4"


def test_identical_errors_are_grouped_capped_and_keep_the_learners_lines():
    same = [Failure(r, r, "ZeroDivisionError", "division by zero", TB) for r in range(4)]
    err = failures.describe(same)
    assert isinstance(err, EngineError)
    assert "[ranks 0-3] ZeroDivisionError: division by zero" in err.cause
    assert "in scale: return y / (rank - rank)" in err.cause and "ipyparallel" not in err.cause
    many = [Failure(r, r, "ValueError", f"bad {r}") for r in range(7)]
    text = failures.describe(many, max_groups=3).cause
    assert "[rank 2] ValueError: bad 2" in text and "bad 3" not in text
    assert "... and 4 more rank(s) with other errors" in text


def test_a_course_error_raised_on_an_engine_keeps_its_own_fix():
    err = failures.describe([Failure(0, 0, "PortInUse", "port 5 is taken\nFix: pick another")])
    assert err.fix == "pick another" and "Fix:" not in err.cause


def test_mismatch_names_ranks_op_and_shapes():
    mirrored = MISMATCH_0.replace("Rank 0 is", "Rank X is").replace("Rank 1 is", "Rank 0 is")
    err = failures.describe([Failure(0, 0, "RuntimeError", MISMATCH_0),
                             Failure(1, 1, "RuntimeError", mirrored.replace("Rank X", "Rank 1"))])
    assert isinstance(err, CollectiveMismatch)
    assert "rank 0: all_reduce, shape [2, 2], float" in err.cause
    assert "rank 1: all_reduce, shape [3, 2], float" in err.cause
    assert "differ in tensor shape" in err.cause and "still usable" in err.fix
    assert messages.op_name("_REDUCE_SCATTER_BASE") == "reduce_scatter_tensor"


def test_timeouts_and_dead_groups_name_restart():
    timed = failures.describe([Failure(1, 1, "RuntimeError", GLOO_TIMEOUT)])
    assert isinstance(timed, ProcessGroupGone) and "cu.restart()" in timed.fix
    assert "rank 1 waited in a collective for 5 s" in timed.cause
    on_a = failures.describe([Failure(1, 1, "RuntimeError", GLOO_TIMEOUT, host="a"),
                              Failure(0, 0, "RuntimeError", GLOO_TIMEOUT, host="a")])
    assert "ranks 0-1 on a waited in a collective for 5 s" in on_a.cause
    spread = failures.ranks_where([Failure(1, 1, "E", "", host="a"), Failure(2, 2, "E", "",
                                                                              host="b")])
    assert spread == "ranks 1-2 (on a, b)" and Failure(3, 3, "E", "", host="b").where == \
        "rank 3 on b"
    gone = failures.describe([Failure(0, 0, "RuntimeError", GLOO_GONE),
                              Failure(1, 1, "RuntimeError", "Application timeout caused pair "
                                                            "closure")])
    assert isinstance(gone, ProcessGroupGone) and "the process group is gone" in gone.cause
    barrier = failures.describe([Failure(0, 0, "RuntimeError", BARRIER)])
    assert "rank 1 never reached the collective that rank 0 waited in for 2 s" in barrier.cause


def test_stack_dump_names_the_collective_and_the_learners_line():
    assert engine.summarize_stack(FAULTHANDLER) == (
        "in all_reduce (torch.distributed), called from only_rank0_reduces line 9")
    assert engine.summarize_stack("") == "running (no stack available)"


def test_backend_string_maps_cpu_tensors_to_gloo_under_nccl():
    assert pg.pg_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert pg.pg_backend("gloo") == "gloo"
    assert pg.backend_label("nccl") == "nccl+gloo"


def test_debug_level_setting(monkeypatch):
    monkeypatch.delenv("COURSE_TORCH_DEBUG", raising=False)
    assert pg.debug_level(None) == "off"  # a plain group unless a unit asks for DETAIL
    assert pg.debug_level(False) == "off" and pg.debug_level("INFO") == "info"
    monkeypatch.setenv("COURSE_TORCH_DEBUG", "DETAIL")
    assert pg.debug_level(None) == "detail"
    monkeypatch.setenv("COURSE_TORCH_DEBUG", "loud")
    with pytest.raises(ValueError, match="not one of"):
        settings.torch_debug()


def test_torch_device_setting(monkeypatch):
    monkeypatch.delenv("COURSE_TORCH_DEVICE", raising=False)
    assert settings.torch_device() == "cpu"  # gloo keeps tensors on the CPU unless asked
    monkeypatch.setenv("COURSE_TORCH_DEVICE", " CUDA ")
    assert settings.torch_device() == "cuda"
    monkeypatch.setenv("COURSE_TORCH_DEVICE", "gpu")
    with pytest.raises(ValueError, match="not cpu or cuda"):
        settings.torch_device()


def test_loopback_addresses():
    assert exposure.is_loopback("127.0.0.1") and exposure.is_loopback("::1")
    assert not exposure.is_loopback("0.0.0.0") and not exposure.is_loopback("::")
    assert not exposure.is_loopback("192.168.1.5")
    assert exposure.listening() == [] or all(len(x) == 3 for x in exposure.listening())


def test_busy_line_says_queue_and_how_long():
    line = sharing.busy_line({0: {"since": 14.2}, 1: {"since": 3.0}})
    assert line == ("cu: connected; engines [0, 1] are running for 14 s with another "
                    "notebook's cell: cells you run here queue behind it")
    assert "are busy with" in sharing.busy_line({0: {"since": None}})


def test_data_dir_prefers_the_checkout_then_the_installed_copy(tmp_path, monkeypatch):
    assert settings.data_dir("profiles").joinpath("two-hosts.toml").exists()
    fake = tmp_path / "share" / "dist-training-course" / "nowhere-in-checkout"
    fake.mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert settings.data_dir("nowhere-in-checkout") == fake


def test_stale_stack_files_are_removed_live_ones_kept():
    import os
    import subprocess
    from pathlib import Path

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live = Path(engine.stack_file(gone.pid)), Path(engine.stack_file(os.getpid()))
    dead.write_text("x")
    live.write_text("x")
    try:
        assert engine.remove_stale_stack_files() >= 1
        assert not dead.exists() and live.exists()
    finally:
        live.unlink(missing_ok=True)
        dead.unlink(missing_ok=True)


def test_a_mismatch_torch_did_not_spell_per_rank_still_says_something():
    from course_utils.torch_dist.messages import mismatch_error

    text = ("Detected mismatch between collectives on ranks. Rank 1 is running inconsistent "
            "collective: CollectiveFingerPrint(OpType=BARRIER)")
    err = str(mismatch_error([text]))
    assert "collective #" not in err, err  # no empty sequence number
    assert "torch said: Detected mismatch" in err and "OpType=BARRIER" in err, err
    assert "returns early" in err, err
    full = str(mismatch_error([MISMATCH_0]))
    assert "collective #1 of the group" in full and "rank 0: all_reduce, shape [2, 2]" in full


def test_a_call_after_cu_stop_names_the_stop_and_cu_start():
    import time

    from course_utils.cluster.kernel.stopped import stopped_error

    own = stopped_error("c1", True, time.time() - 12)
    assert own.cause.startswith("cluster 'c1' was stopped by cu.stop() 12 s ago: its engines")
    assert own.fix.startswith("run cu.start()")
    joined = stopped_error("c1", False, time.time())
    assert joined.cause.startswith("this kernel disconnected from cluster 'c1' (cu.stop()) 0 s")


def test_a_rank_whose_host_is_gone_is_named_with_that_host():
    import ipyparallel as ipp

    from course_utils.cluster.kernel.remote_errors import engine_error
    from tests.rank_maps import two_hosts

    two = two_hosts()
    exc = ipp.error.CompositeError("ranks raised", [
        ("RuntimeError", "Connection closed by peer", [], {"engine_id": 10}),
        ("EngineError", "Engine 12 died while running task 'x'", [], {}),
        ("EngineError", "Engine 99 died while running task 'x'", [], {})])
    err = engine_error(exc, two)
    assert "[rank 0 on a] RuntimeError: Connection closed by peer" in err.cause
    assert "[rank 2 on b] EngineError: died or lost contact with the controller" in err.cause
    assert "[engine 99] EngineError" in err.cause
    assert err.fix.startswith("rank 2 on b, engine 99 is gone: check that host")
