"""TF helpers: cluster spec and TF_CONFIG as pure functions; real servers on engines for the
readiness check and the missing-ps error; the thread-pool guard against co-located servers
hanging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from course_utils import tf_dist
from course_utils.cluster.engines.engine import getenv
from course_utils.cluster.ports import free_port
from course_utils.errors import CourseError

ROLES_2 = {"ps": [0, 0], "worker": [0, 1]}
PORTS_2 = {("ps", 0): 2223, ("ps", 1): 2224, ("worker", 0): 2222, ("worker", 1): 2225}


# ---- pure ----------------------------------------------------------------------------------
def test_roles_for_two_engines_keep_rank1_a_pure_worker():
    assert tf_dist.plan_roles(2, num_ps=1) == {"ps": [0], "worker": [0, 1]}
    assert tf_dist.plan_roles(2, num_ps=2) == ROLES_2
    assert tf_dist.plan_roles(4, num_ps=2, num_workers=3) == {"ps": [0, 0], "worker": [0, 1, 2]}
    assert tf_dist.plan_roles(1, num_ps=1, num_workers=2) == {"ps": [0], "worker": [0, 0]}
    assert tf_dist.tasks_on_rank(ROLES_2, 0) == [("ps", 0), ("ps", 1), ("worker", 0)]
    assert tf_dist.tasks_on_rank(ROLES_2, 1) == [("worker", 1)]


@pytest.mark.parametrize("bad", [dict(world_size=0), dict(num_ps=0), dict(num_workers=0),
                                 dict(ps_rank=2)])
def test_roles_reject_impossible_requests(bad):
    kw = {"world_size": 2, **bad}
    with pytest.raises((ValueError, CourseError)):
        tf_dist.plan_roles(**kw)


def test_cluster_dict_and_tf_config_from_a_rank_map():
    spec = tf_dist.cluster_dict(ROLES_2, ["10.0.0.1", "10.0.0.2"], PORTS_2)
    assert spec == {"ps": ["10.0.0.1:2223", "10.0.0.1:2224"],
                    "worker": ["10.0.0.1:2222", "10.0.0.2:2225"]}
    with_chief = tf_dist.cluster_dict(ROLES_2, ["a", "b"], PORTS_2, chief="c:1")
    assert with_chief["chief"] == ["c:1"]
    cfg = tf_dist.make_tf_config(spec, "worker", 1)
    assert cfg == {"cluster": spec, "task": {"type": "worker", "index": 1}}
    assert json.loads(json.dumps(cfg)) == cfg
    with pytest.raises(ValueError, match="tasks 0..1"):
        tf_dist.make_tf_config(spec, "worker", 2)
    with pytest.raises(ValueError, match="not in the cluster"):
        tf_dist.make_tf_config(spec, "chief", 0)


def test_inter_op_threads_grow_with_the_task_count():
    assert tf_dist.inter_op_threads({"ps": ["a:1"], "worker": ["a:2", "b:3"]}) == 4
    assert tf_dist.inter_op_threads({"ps": ["a:1"] * 2, "worker": ["a:2"] * 6}) == 9


def test_one_task_set_for_servers_and_processes():
    ts = tf_dist.TaskSet(roles={"ps": [0], "worker": [0, 1]},
                         cluster={"ps": ["a:1"], "worker": ["a:2", "b:3"]})
    assert ts.rank_of("worker", 1) == ts.rank_of("worker:1") == 1
    assert ts.addresses() == {"ps:0": "a:1", "worker:0": "a:2", "worker:1": "b:3"}
    assert "pid" not in ts.table() and "worker:1     1  b:3" in ts.table()
    ts.pids = {"ps:0": 41, "worker:0": 42, "worker:1": 43}
    assert "    43  b:3" in ts.table()
    with pytest.raises(tf_dist.TFServerNotAnswering, match="not started by"):
        ts.stop()
    ts.stopper = lambda: "stopped"
    assert ts.stop() == "stopped"


def test_wait_ready_names_the_missing_task_and_the_fix_for_its_kind():
    dead = f"127.0.0.1:{free_port()}"
    spec = {"ps": [dead], "worker": [dead]}
    for tasks, fix in ((spec, "correct its address"),
                       (tf_dist.TaskSet({"ps": [0], "worker": [1]}, spec), "start_servers"),
                       (tf_dist.TaskSet({"ps": [0], "worker": [1]}, spec,
                                        hosted_in="processes"), "tasks.start")):
        with pytest.raises(tf_dist.TFServerNotAnswering) as err:
            tf_dist.wait_ready(tasks, timeout=0.3)
        assert f"ps:0 at {dead}" in err.value.cause and fix in err.value.fix


def test_unanswered_names_missing_tasks_within_the_bound():
    t0 = time.monotonic()
    missing = tf_dist.unanswered({"ps:0": f"127.0.0.1:{free_port()}"}, timeout=1.0)
    assert missing == ["ps:0"] and time.monotonic() - t0 < 5


# ---- real servers on engines ---------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    import course_utils as cu

    cc = cu.start(n=2, cluster_id=f"pytest-tf-{os.getpid()}", preload=["tensorflow"])
    yield cc
    tf_dist.stop_servers(cc)
    cc.stop(force=True)


def test_servers_start_answer_and_rerun_reuses_them(cluster):
    tfc = tf_dist.start_servers(cluster, num_ps=2, num_workers=2)
    assert tfc.roles == ROLES_2
    assert tf_dist.wait_ready(tfc, timeout=5) < 5
    hosted = cluster.run(tf_dist.servers.engine_hosted)
    assert hosted == [["ps:0", "ps:1", "worker:0"], ["worker:1"]]
    env = [json.loads(e) for e in cluster.run(getenv, "TF_CONFIG")]
    assert [e["task"] for e in env] == [{"type": "worker", "index": 0},
                                        {"type": "worker", "index": 1}]
    assert tf_dist.start_servers(cluster, num_ps=2, num_workers=2) is tfc  # idempotent
    again = tf_dist.start_servers(cluster, num_ps=1)  # another layout: fresh engines and ports
    assert again is not tfc and again.roles == {"ps": [0], "worker": [0, 1]}
    assert set(again.cluster["ps"]).isdisjoint(tfc.cluster["ps"] + tfc.cluster["worker"])
    assert cluster.run(tf_dist.servers.engine_hosted) == [["ps:0", "worker:0"], ["worker:1"]]


def test_a_missing_ps_is_named_within_the_bound(cluster):
    import dataclasses

    tfc = tf_dist.start_servers(cluster, num_ps=1)
    dead = f"127.0.0.1:{free_port()}"
    broken = dataclasses.replace(tfc, cluster={**tfc.cluster, "ps": [dead]})
    t0 = time.monotonic()
    with pytest.raises(tf_dist.TFServerNotAnswering) as err:
        tf_dist.start_coordinator(broken, timeout=2, cluster=cluster)
    assert time.monotonic() - t0 < 10
    assert f"ps:0 at {dead} (rank 0)" in err.value.cause and "start_servers" in err.value.fix


def test_stop_servers_replaces_engines_that_hosted_servers(cluster):
    tfc = tf_dist.start_servers(cluster, num_ps=1)
    old = set(cluster.ranks.engine_ids)
    assert tfc.stop() is True  # the set's stop is stop_servers
    assert set(cluster.ranks.engine_ids).isdisjoint(old)
    assert cluster.run(tf_dist.servers.engine_hosted) == [[], []]
    assert tf_dist.active() is None
    assert tf_dist.stop_servers(cluster) is False  # nothing hosted: no restart


TAKE_THE_PORT = """
import socket
import course_utils.cluster.ports as _ports
_real_check, taken_port, _taker = _ports.port_in_use, None, socket.socket()


def _taken_first(port, host="127.0.0.1"):
    # What another program did between the pick and the server's bind, once: listen on it.
    global taken_port
    if taken_port is None:
        _taker.bind((host, port))
        _taker.listen()
        taken_port = port
    return _real_check(port, host)


_ports.port_in_use = _taken_first
"""


def test_a_port_taken_before_its_server_binds_is_picked_again(cluster):
    tf_dist.stop_servers(cluster)
    rank1 = cluster.ranks[1].engine_id
    cluster.view.execute(TAKE_THE_PORT, targets=rank1, block=True)
    tfc = tf_dist.start_servers(cluster, num_ps=1)  # rank 1's first pick is taken: again
    # Only the second pick replaced the engines (the first had started rank 0's servers).
    assert cluster.ranks[1].engine_id != rank1
    assert tf_dist.wait_ready(tfc, timeout=5) < 5
    assert cluster.run(tf_dist.servers.engine_hosted) == [["ps:0", "worker:0"], ["worker:1"]]


def test_register_server_names_tasks_and_refuses_a_second_server():
    from course_utils.tf_dist import servers

    saved = dict(servers._SERVERS)
    a, b = object(), object()
    try:
        servers._SERVERS.clear()
        tf_dist.register_server("ps:0", a)
        tf_dist.register_server("ps:0", a)  # the same server again: fine (a re-run)
        assert servers.engine_hosted() == ["ps:0"]
        with pytest.raises(CourseError, match="already hosts a server for ps:0"):
            tf_dist.register_server("ps:0", b)
        for bad in ("chief:0", "ps", "worker:x"):
            with pytest.raises(ValueError, match="job:index"):
                tf_dist.register_server(bad, a)
    finally:
        servers._SERVERS.clear()
        servers._SERVERS.update(saved)


BY_HAND = """
from course_utils import tf_dist
tf = tf_dist.quiet_tensorflow()
tf_servers = {}
for job, index in tf_dist.tasks_on_rank(ROLES, rank):
    tf_servers[f"{job}:{index}"] = tf.distribute.Server(
        tf.train.ClusterSpec(SPEC), job_name=job, task_index=index,
        config=tf_dist.server_config(SPEC), start=True)
    tf_dist.register_server(f"{job}:{index}", tf_servers[f"{job}:{index}"])
tf_cluster = SPEC
worker_index = next((i for j, i in tf_dist.tasks_on_rank(ROLES, rank) if j == "worker"), None)
"""


def test_servers_started_by_hand_are_checked_adopted_and_torn_down(cluster):
    """Unit 4's path: ports from the engines, servers started by the learner's code and
    registered, then checked, adopted, used for one step, and replaced by stop_servers."""
    from course_utils import checks

    tf_dist.stop_servers(cluster)
    roles = tf_dist.plan_roles(cluster.world_size, num_ps=1)
    ports = tf_dist.pick_ports(cluster, roles)
    assert sorted(ports) == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert len(set(ports.values())) == 3
    spec = tf_dist.cluster_dict(roles, [r.addr for r in cluster.ranks], ports)
    cluster.push({"SPEC": spec, "ROLES": roles})
    cluster.view.execute(BY_HAND, block=True)
    assert tf_dist.hosted_by_rank(cluster) == [["ps:0", "worker:0"], ["worker:1"]]
    report = cluster.run(checks.engine_tf_servers)
    # server_config sizes the inter-op pool (4), which unit 4's check asks of the learner's servers
    assert report[1] == {"worker:1": {"job": "worker", "task": 1, "port": ports[("worker", 1)],
                                      "inter_op": 4}}
    with pytest.raises(tf_dist.TFServerNotAnswering, match="rank 0 hosts"):
        tf_dist.adopt_servers(cluster, {"ps": [1], "worker": [0, 1]}, spec)
    tfc = tf_dist.adopt_servers(cluster, roles, spec, timeout=5)
    assert tf_dist.active() is tfc and tfc.cluster == spec and tfc.inter_op == 4
    assert cluster.run_on(0, checks.engine_tf_one_step, timeout=60) == pytest.approx(0.6)
    assert tf_dist.start_servers(cluster, num_ps=1) is tfc  # the helpers take over
    old = set(cluster.ranks.engine_ids)
    assert tf_dist.stop_servers(cluster) is True
    assert set(cluster.ranks.engine_ids).isdisjoint(old)


def test_run_training_timeout_names_the_line_and_frees_the_engines(cluster):
    """A loop no hook can stop (it never calls sess.run, or got no hooks) times out with the
    rank's line, is interrupted, and the next call finds the engines free."""
    cluster.view.execute("import time\ndef spinning():\n    while True:\n"
                         "        time.sleep(0.05)\n", block=True)
    t0 = time.monotonic()
    with pytest.raises(tf_dist.TFTimeout) as err:
        tf_dist.run_training(cluster, "spinning", timeout=1)
    assert time.monotonic() - t0 < 20
    cause = err.value.cause
    assert "StopAtStepHook" in cause and "collective" not in cause
    assert "spinning" in cause and "the engines are free again" in cause
    assert "stop_servers" not in err.value.fix
    assert len(cluster.run(os.getpid, timeout=10)) == cluster.world_size


# ---- the thread-pool guard -----------------------------------------------------------------
IN_PROCESS = textwrap.dedent("""
    import os, sys
    from course_utils import tf_dist
    from course_utils.cluster.ports import free_ports
    tf = tf_dist.quiet_tensorflow()
    mode = sys.argv[1]
    p = free_ports(4)
    spec = {"ps": [f"127.0.0.1:{p[0]}"], "worker": [f"127.0.0.1:{p[1]}", f"127.0.0.1:{p[2]}"]}
    if mode == "helper":
        cfg = tf_dist.server_config(spec)
        tf.config.threading.set_inter_op_parallelism_threads(tf_dist.inter_op_threads(spec))
    else:  # what a 1-2 core machine gets by default: one or two inter-op threads per server
        cfg = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    cs = tf.train.ClusterSpec(spec)
    for job in ("ps", "worker"):
        for i in range(len(spec[job])):
            tf.distribute.Server(cs, job, i, config=cfg, protocol="grpc")
    res = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({**spec, "chief": [f"127.0.0.1:{p[3]}"]}), task_type="chief",
        task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(res)
    coord = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        v = tf.Variable(0.0)
    ds = coord.create_per_worker_dataset(lambda: tf.data.Dataset.range(10**6).map(
        lambda i: tf.cast(i, tf.float32)))
    it = iter(ds)
    @tf.function
    def step(it):
        return strategy.run(lambda x: v.assign_add(x * 0.0 + 1.0), args=(next(it),))
    for _ in range(50):
        coord.schedule(step, args=(it,))
    coord.join()
    print("steps", int(v.numpy()), flush=True)
    os._exit(0)
""")


def _in_process(mode: str, timeout: float) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", IN_PROCESS, mode], capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - t0, "timed out"
    return out.returncode == 0, time.monotonic() - t0, out.stdout + out.stderr[-2000:]


def test_sized_pools_finish_where_starved_pools_hang():
    ok, seconds, out = _in_process("helper", timeout=90)
    assert ok and "steps 50" in out, out
    starved_ok, starved_s, _ = _in_process("starved", timeout=30)
    assert not starved_ok, (
        f"starved pools finished in {starved_s:.1f} s: the guard is no longer needed here")
    print(f"helper pools: 50 steps incl. TF start in {seconds:.1f} s; "
          f"1-thread pools: no result after {starved_s:.0f} s")


def test_cross_task_traffic_counts_what_crosses_tasks():
    tf = tf_dist.quiet_tensorflow()
    graph = tf.Graph()
    setter = tf.compat.v1.train.replica_device_setter(
        ps_tasks=1, worker_device="/job:worker/task:0")
    with graph.as_default(), tf.compat.v1.device(setter):
        w = tf.compat.v1.get_variable("w", [64, 10], use_resource=True)
        x = tf.compat.v1.placeholder(tf.float32, [None, 64])
        y = tf.matmul(x, w)
        with tf.compat.v1.device("/job:ps/task:0"):
            tf.reduce_sum(y)
    moves = {m["tensor"]: m for m in tf_dist.cross_task_traffic(graph, batch=8)}
    read = next(m for name, m in moves.items() if name.startswith("w"))  # handle or its read
    assert read["bytes"] == 64 * 10 * 4 and not read["per_example"], moves
    assert moves["MatMul:0"]["bytes"] == 8 * 10 * 4 and moves["MatMul:0"]["per_example"]
    assert moves["MatMul:0"]["to"] == "/job:ps/task:0"
    assert tf_dist.task_of("/job:ps/task:0/device:CPU:0") == "/job:ps/task:0"


# A real ClusterCoordinator (ps, worker and chief in one process) in the state unit 5's lost
# worker leaves it in: its reconnect thread holds the failure lock (TensorFlow's
# update_server_def waits for the lost task forever). TensorFlow's own stop(), which the
# garbage collector runs via __del__, then waits forever; after stop_coordinators it does not.
STUCK = textwrap.dedent("""
    import os, threading, time
    from course_utils import tf_dist
    from course_utils.cluster.ports import free_ports
    tf = tf_dist.quiet_tensorflow()
    p = free_ports(3)
    spec = {"ps": [f"127.0.0.1:{p[0]}"], "worker": [f"127.0.0.1:{p[1]}"]}
    tf.config.threading.set_inter_op_parallelism_threads(tf_dist.inter_op_threads(spec))
    cs = tf.train.ClusterSpec(spec)
    for job in ("ps", "worker"):
        tf.distribute.Server(cs, job, 0, config=tf_dist.server_config(spec), protocol="grpc")
    res = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({**spec, "chief": [f"127.0.0.1:{p[2]}"]}), task_type="chief",
        task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(res)
    coord = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        v = tf.Variable(0.0)
    bump = tf.function(lambda: v.assign_add(1.0))
    print("join_within", tf_dist.join_within(coord, timeout=60, schedule=[bump] * 3)[0],
          int(v.numpy()), flush=True)
    fail = tf.function(lambda: tf.debugging.assert_equal(v, -1.0))
    print("error", tf_dist.join_within(coord, timeout=60, schedule=[fail])[0] is not None,
          flush=True)
    for _ in range(3):
        coord.schedule(bump)
    print("join", tf_dist.join(coord, timeout=60) >= 0, int(v.numpy()), flush=True)
    nan = tf.function(lambda: tf.debugging.check_numerics(tf.math.log(v - 100.0), "log<0"))
    coord.schedule(nan)
    try:  # the step's own error (at run time, on the worker), as join() raised it
        tf_dist.join(coord, timeout=60)
    except tf.errors.InvalidArgumentError as exc:
        print("join raises", "log<0" in str(exc), flush=True)
    slow = tf.function(lambda: tf.py_function(lambda: time.sleep(3) or 0.0, [], tf.float32))
    coord.schedule(slow)
    try:
        tf_dist.join(coord, timeout=0.5)
    except tf_dist.TFTimeout as exc:
        print("join times out", "Fix:" in str(exc), flush=True)
    tf_dist.join(coord, timeout=60)
    handler = coord._cluster.failure_handler
    print("healthy retired", tf_dist.stop_coordinators(only_stuck=True), flush=True)
    from tensorflow.python.eager import context
    def reconnecting(*args, **kwargs):  # update_server_def waiting for a lost task, forever
        time.sleep(3600)
    context.context().update_server_def = reconnecting
    handler._cluster_due_for_update_or_finish.set()  # what a lost worker does
    deadline = time.monotonic() + 30  # until TF's own thread holds the lock inside it
    while not handler._cluster_update_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.05)
    tf_stop = threading.Thread(target=handler.stop, daemon=True)
    tf_stop.start()
    tf_stop.join(3)
    print("tf stop waits", tf_stop.is_alive(), flush=True)
    print("stuck retired", tf_dist.stop_coordinators(only_stuck=True), flush=True)
    print("again", tf_dist.stop_coordinators(), flush=True)
    gone = threading.Thread(target=coord.__del__, daemon=True)
    gone.start()
    gone.join(10)
    print("del waits", gone.is_alive(), flush=True)
    os._exit(0)
""")


def test_stop_coordinators_frees_a_coordinator_stuck_reconnecting():
    out = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True,
                         timeout=120)
    lines = set(out.stdout.splitlines())
    assert {"join_within None 3", "error True", "join True 6", "join raises True",
            "join times out True", "healthy retired 0", "tf stop waits True",
            "stuck retired 1", "again 0", "del waits False"} <= lines, \
        out.stdout + out.stderr[-2000:]
