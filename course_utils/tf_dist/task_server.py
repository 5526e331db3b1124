"""The task processes of :mod:`.tasks` (units 7-9, the drills of ``08_hangs_and_faults``): each
ps/worker task is a real ``tf.distribute.Server`` in a process of its own, so killing it loses
exactly one task and the engine that started it lives on.

Importing TensorFlow costs seconds of CPU, once per process. So each engine starts one
*zygote* (``python -m course_utils.tf_dist.task_server``): it imports TensorFlow once, then
reads one JSON request per line on its standard input (``{"spec": ..., "task": "ps:0",
"inter_op": 4}``) and forks a child per request; the child starts its server at once (no
import) and answers the child's pid on standard output. The zygote exits when its standard
input closes (the engine went away); its children are killed when the zygote goes
(``PR_SET_PDEATHSIG``) and after ``LIFETIME`` seconds at the latest.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

#: Seconds a task process lives at most: never outlive a forgotten drill.
LIFETIME = 900.0


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the lifetime still bounds the child
        pass


def _serve(tf: object, request: dict[str, object]) -> None:
    from .spec import server_config

    spec = request["spec"]
    job, _, index = str(request["task"]).partition(":")
    tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job,  # type: ignore[attr-defined]
                         task_index=int(index), protocol="grpc", start=True,
                         config=server_config(spec, int(request["inter_op"])))  # type: ignore[arg-type]
    deadline = time.monotonic() + LIFETIME
    while time.monotonic() < deadline:
        time.sleep(1.0)


def main() -> None:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ.pop("TF_CONFIG", None)
    from .quiet import quiet_tensorflow

    tf = quiet_tensorflow()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)    # children are reaped without waiting
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _die_with_parent()
                _serve(tf, request)
            finally:
                os._exit(0)
        print(json.dumps({"task": request["task"], "pid": pid}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
