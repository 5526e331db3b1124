"""The ``course`` command: a thin face over the library functions the notebooks use.

    course lab [--engines N] [--no-browser] [--port P] [--workdir W | --source] [-- jupyter args]
    course home | course solution UNIT EXERCISE | course kernel
    course doctor [--engines N] [--no-tf] [--profile PROFILE | --hosts PROFILE]
    course bench startup [--engines N]
    course stop
    course viz-gallery OUTDIR [--ring-ranks 4] [--no-tf]
    course release | grade | feedback | slides   (the instructor's commands, see --help)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import settings


def _notebooks_dir() -> Path:
    nb = settings.data_dir("notebooks")  # the checkout's, or the installed package's copy
    return nb if nb.is_dir() else Path.cwd()


def cmd_lab(args: argparse.Namespace) -> int:
    """Start the course cluster, then JupyterLab on the learner's working folder (or, with
    --source, the notebooks); stop both on exit."""
    from . import cluster
    from .errors import CourseError
    from .learner import lab as lab_setup

    try:
        plan = lab_setup.prepare(args.workdir, args.source, _notebooks_dir())
    except CourseError as exc:
        print(f"course lab: {exc}", file=sys.stderr)
        return 1
    os.environ[settings.ENV_ENGINES] = str(args.engines)
    t0 = time.perf_counter()
    try:
        cc = cluster.start(n=args.engines, profile=args.profile)
    except CourseError as exc:
        print(f"course lab: the cluster did not start.\n{exc}", file=sys.stderr)
        return 1
    print(f"course lab: {cc.world_size} engines ready in {time.perf_counter() - t0:.1f} s "
          f"(cluster id {cc.cluster_id!r}, profile {cc.profile.name})")
    print(cc.ranks.table())
    plan.started(cc)

    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={plan.root}",
           f"--port={args.port}", f"--ServerApp.ip={args.ip}"]
    if args.no_browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI run as root
    cmd += plan.jupyter_args + args.jupyter_args
    env = plan.environment({**os.environ, settings.ENV_CLUSTER_ID: cc.cluster_id})
    proc = subprocess.Popen(cmd, env=env)

    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while proc.poll() is None:
            time.sleep(0.2)
    finally:
        with contextlib.suppress(Exception):
            proc.wait(timeout=20)
        if proc.poll() is None:
            proc.kill()
        print("course lab: stopping the cluster")
        cc.stop(force=True)
        # Engines a kernel re-started (cu.restart) are recorded in the cluster file.
        cluster.stop_running(cc.cluster_id)
    return 0 if stopping else (proc.returncode or 0)


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.hosts:  # two-host workshops: check every host of an SSH profile (unit 6)
        from .instructor.doctor_hosts import run_host_checks

        results = run_host_checks(args.hosts, timeout=args.timeout)
        return 1 if any(c.status == "FAIL" for c in results) else 0
    if args.profile is not None:  # e.g. a Slurm profile: its own checks, then its engines
        from .instructor.doctor_slurm import profile_checks

        results = []
        for check in profile_checks(args.profile, args.engines, args.timeout, not args.no_tf):
            print(check.line())
            results.append(check)
    else:
        from .instructor.doctor import run_checks

        results = run_checks(engines=args.engines, timeout=args.timeout, tf=not args.no_tf)
    failed = [c for c in results if not c.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .instructor import bench

    if args.what == "startup":
        bench.print_json(bench.startup(n=args.engines, repeat=args.repeat))
        return 0
    print(f"unknown benchmark {args.what!r}; choose: startup", file=sys.stderr)
    return 2


def cmd_stop(args: argparse.Namespace) -> int:
    from . import cluster

    stopped = cluster.stop_running(args.cluster_id)
    print("stopped the running cluster" if stopped else "no running cluster found")
    return 0


def cmd_viz_gallery(args: argparse.Namespace) -> int:
    from .instructor import gallery

    items = gallery.run(args.outdir, ring_ranks=args.ring_ranks, tf=not args.no_tf)
    code = 1 if any(it.error for it in items) else 0
    if "tensorflow" in sys.modules:
        # Unit 5's coordinator keeps non-daemon threads retrying the worker the gallery killed;
        # the engines are already stopped and every file written, so leave without waiting.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def build_parser() -> argparse.ArgumentParser:
    from .learner import lab as lab_setup

    p = argparse.ArgumentParser(prog="course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    lab = sub.add_parser("lab", help="start the cluster and JupyterLab on the notebooks")
    lab.add_argument("--engines", type=int, default=None,
                     help="engines to start (default $COURSE_ENGINES or 2)")
    lab.add_argument("--profile", default=None, help="cluster profile: local (default) or a file")
    lab.add_argument("--port", type=int, default=8888)
    lab.add_argument("--ip", default="127.0.0.1")
    lab.add_argument("--no-browser", action="store_true")
    lab_setup.add_lab_arguments(lab)
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER,
                     help="after --: passed to jupyter lab unchanged")
    lab.set_defaults(func=cmd_lab)

    doc = sub.add_parser("doctor", help="check versions, hardware and a real 2-engine cluster")
    doc.add_argument("--engines", type=int, default=2)
    doc.add_argument("--timeout", type=float, default=60)
    doc.add_argument("--no-tf", action="store_true", help="skip the TensorFlow checks")
    doc.add_argument("--profile", default=None,
                     help="check a cluster profile instead (a slurm profile: the scheduler, "
                          "its partition, a tiny job, then engines as a Slurm job)")
    doc.add_argument("--hosts", metavar="PROFILE", default=None,
                     help="check every host of an SSH profile (ssh, python, GPUs, interface, "
                          "shared paths, ports, a cross-host all_reduce)")
    doc.set_defaults(func=cmd_doctor)

    b = sub.add_parser("bench", help="benchmarks; prints a JSON line last")
    b.add_argument("what", choices=["startup"])
    b.add_argument("--engines", type=int, default=2)
    b.add_argument("--repeat", type=int, default=200)
    b.set_defaults(func=cmd_bench)

    st = sub.add_parser("stop", help="stop a cluster left running (e.g. by a killed course lab)")
    st.add_argument("--cluster-id", default=None)
    st.set_defaults(func=cmd_stop)

    vg = sub.add_parser("viz-gallery", help="every figure of the course, from real runs, "
                        "into OUTDIR (PNG, HTML, index.html)")
    vg.add_argument("outdir")
    vg.add_argument("--ring-ranks", type=int, default=4, help="ranks of the ring replay")
    vg.add_argument("--no-tf", action="store_true", help="skip the TensorFlow figures")
    vg.set_defaults(func=cmd_viz_gallery)
    lab_setup.add_commands(sub)

    from .instructor.commands import register as register_instructor

    register_instructor(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "engines", 1) is None:
        args.engines = settings.default_engines()
    if getattr(args, "engines", 1) < 1:
        print("course: --engines must be 1 or more", file=sys.stderr)
        return 2
    if getattr(args, "jupyter_args", None) and args.jupyter_args[0] == "--":
        args.jupyter_args = args.jupyter_args[1:]
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
