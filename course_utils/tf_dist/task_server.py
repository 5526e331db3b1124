"""One ``tf.distribute.Server`` in a process of its own: the task processes of the TensorFlow
drills in ``08_hangs_and_faults`` (:mod:`course_utils.tf_dist.faults` starts them from the
engines). Killing this process loses exactly one task, and the engine that started it lives on.

``python -m course_utils.tf_dist.task_server SPEC_JSON JOB INDEX INTER_OP`` serves until its
standard input closes (the engine that started it went away) or ``--lifetime`` seconds pass.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("job")
    ap.add_argument("index", type=int)
    ap.add_argument("inter_op", type=int)
    ap.add_argument("--lifetime", type=float, default=900.0)
    args = ap.parse_args()
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    threading.Timer(args.lifetime, os._exit, (0,)).start()   # never outlive a forgotten drill

    from .quiet import quiet_tensorflow
    from .spec import server_config

    tf = quiet_tensorflow()
    spec = json.loads(args.spec)
    tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=args.job, task_index=args.index,
                         config=server_config(spec, args.inter_op), protocol="grpc", start=True)
    print(f"serving {args.job}:{args.index}", flush=True)
    sys.stdin.read()          # returns at EOF: the engine that started this process is gone
    os._exit(0)


if __name__ == "__main__":
    main()
