"""Unit 6's graduation: the learner's own training script, run for real under ``torchrun``.

Introduced in ``06_two_hosts``. The learner writes ``train_ddp.py`` (env:// init, ``LOCAL_RANK``
picks the device, metrics reduced on that device, rank 0 saves the checkpoint, every rank
resumes from it) and the ``torchrun`` line every node runs. What the tests use:

* :func:`run_one_node`: the script under ``torchrun`` on this machine (one node,
  ``nproc`` processes), with a timeout; :class:`ScriptRun` holds the JSON lines it printed;
* :func:`run_problems`: what a run shows wrong (exit code, saves, resume, reduced metrics);
* :func:`posed_two_hosts` and :func:`device_problems`: the device choice checked on a rank map
  of two hosts with two ranks each, where local rank and rank differ (on one host they do not);
* :func:`line_problems` and :func:`run_line_as_nodes`: the learner's multi-node line, checked
  flag by flag, then run as ``nnodes`` nodes (on one machine: every node on loopback).

The script prints one JSON line per event (``{"rank", "event": "start" | "saved" | "done",
...}``); nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..cluster.ports import free_port
from ..cluster.ranks import RankMap, build_rank_map

#: What every node's copy of the learner's line may read: set per node by :func:`node_env`.
LINE_VARIABLES = ("NPROC_PER_NODE", "NODE_RANK", "NODE_ADDR", "MASTER_ADDR", "MASTER_PORT",
                  "RDZV_ENDPOINT", "IS_HOST")


@dataclass
class ScriptRun:
    """One launch of the script: per node its argv, exit code and output, and the JSON lines."""

    argvs: list[list[str]] = field(default_factory=list)
    returncodes: list[int | None] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def lines(self) -> list[dict[str, Any]]:
        """Every JSON line the ranks printed, in order."""
        out = []
        for text in self.stdout:
            for ln in text.splitlines():
                if ln.startswith("{"):
                    try:
                        out.append(json.loads(ln))
                    except ValueError:
                        continue
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        """The lines of one event (``"start"``, ``"saved"``, ``"done"``), sorted by rank."""
        return sorted((ln for ln in self.lines if ln.get("event") == name),
                      key=lambda ln: ln.get("rank", -1))

    @property
    def ok(self) -> bool:
        return bool(self.returncodes) and all(rc == 0 for rc in self.returncodes)

    def tail(self, n: int = 1500) -> str:
        """The end of every node's stderr: what to read when the run failed."""
        return "\n".join(f"--- node {i} (exit {rc}):\n{err[-n:]}" for i, (rc, err) in
                         enumerate(zip(self.returncodes, self.stderr, strict=True)))

    def summary(self) -> str:
        done = self.events("done")
        what = ", ".join(f"rank {d.get('rank')}: loss {d.get('loss', float('nan')):.4f}"
                         for d in done) or "no rank finished"
        return (f"{len(self.argvs)} node(s), exit {self.returncodes}, {self.seconds:.0f} s; "
                f"{what}")


def torchrun_path() -> str:
    """The ``torchrun`` next to this Python (the course's venv), else the one on PATH."""
    here = Path(sys.executable).parent / "torchrun"
    return str(here) if here.exists() else "torchrun"


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # the kernel's own rank variables must not reach the script
    return {**env, **(extra or {})}


def run_one_node(script: str | os.PathLike[str], args: Sequence[str] = (), nproc: int = 2,
                 timeout: float = 300, cwd: str | os.PathLike[str] | None = None) -> ScriptRun:
    """``torchrun --nnodes 1 --nproc-per-node nproc`` (c10d rendezvous on loopback) of
    ``script args``; killed after ``timeout`` seconds (the run then shows exit code ``None``)."""
    from ..cluster.launchers.slurm_script import torchrun_args

    port = free_port("127.0.0.1")
    argv = torchrun_args(1, nproc, f"127.0.0.1:{port}", rdzv_id="unit6", torchrun=torchrun_path(),
                         local_addr="127.0.0.1", is_host=True, script=str(script),
                         script_args=list(args))
    return _run([argv], [_env()], timeout, cwd)


Popen = Callable[..., "subprocess.Popen[str]"]


def _run(argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], timeout: float,
         cwd: str | os.PathLike[str] | None, popens: Sequence[Popen] | None = None) -> ScriptRun:
    run = ScriptRun(argvs=[list(a) for a in argvs])
    t0 = time.perf_counter()
    starts = list(popens or [subprocess.Popen] * len(argvs))
    procs = [start(list(a), env=dict(e), cwd=cwd, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True, start_new_session=True)
             for start, a, e in zip(starts, argvs, envs, strict=True)]
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            rc: int | None = p.returncode
        except subprocess.TimeoutExpired:
            for q in procs:
                _kill_group(q)
            out, err = p.communicate()
            err += f"\n[course] killed after {timeout:.0f} s: the run did not finish in time"
            rc = None
        run.stdout.append(out)
        run.stderr.append(err)
        run.returncodes.append(rc)
    run.seconds = time.perf_counter() - t0
    return run


def _kill_group(p: subprocess.Popen[str]) -> None:
    import signal

    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()


def load_script(path: str | os.PathLike[str]) -> ModuleType:
    """The learner's script as a module, read afresh (``__name__`` is not ``"__main__"``, so
    its ``main()`` does not run): the tests call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"learner_{Path(path).stem}", str(path))
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path}: no such script; run the %%writefile cell first")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_problems(run: ScriptRun | None, world: int, steps: int,
                 resumed_from: int = 0) -> list[str]:
    """What a run of the learner's script shows wrong: every rank must exit 0, start at
    ``resumed_from`` (0: a fresh run; else the checkpoint's step), finish ``steps`` with the
    same reduced loss on every rank, and rank 0 alone must save the checkpoint. ``None``: the
    run was not made (an earlier one failed)."""
    if run is None:
        return ["not run: the run before it failed (see above)"]
    if not run.ok:
        return [f"torchrun exited {run.returncodes}: read the end of its output:\n{run.tail()}"]
    problems = []
    starts, done, saved = run.events("start"), run.events("done"), run.events("saved")
    if sorted(d.get("rank") for d in done) != list(range(world)):
        problems.append(f"expected a 'done' line from each of ranks 0..{world - 1}, got "
                        f"{[d.get('rank') for d in done]}")
    wrong_start = [s for s in starts if s.get("step") != resumed_from]
    if resumed_from and (wrong_start or not starts):
        problems.append(
            f"run again, every rank must resume from the checkpoint's step {resumed_from}; "
            f"they started at {[(s.get('rank'), s.get('step')) for s in starts]}: call "
            "load_checkpoint(args.checkpoint, model, opt) before training and train from the "
            "step it returns")
    elif wrong_start:
        problems.append(f"a fresh run must start at step 0: {wrong_start}")
    lacking = [(s.get("rank"), k) for s in starts for k in ("local_rank", "world_size", "device")
               if k not in s] + [(d.get("rank"), "step") for d in done if d.get("step") != steps]
    if lacking:
        problems.append(
            f"the 'start' and 'done' lines lack fields (rank, field): {lacking}: "
            "report(event='start', step=start, local_rank=..., world_size=..., "
            f"device=str(device)) and report(event='done', step=args.steps (here {steps}), "
            "**metrics)")
    if [s.get("rank") for s in saved] != [0] or saved[0].get("step") != steps:
        problems.append(
            f"rank 0 alone must save, once, at step {steps}; saves seen: "
            f"{[(s.get('rank'), s.get('step')) for s in saved]}. Every rank holds the same "
            "weights: save only on rank 0 (if rank == 0: save_checkpoint(...)), or the ranks "
            "write over each other's file")
    losses = {round(float(d.get("loss", float("nan"))), 9) for d in done}
    if done and (len(losses) != 1 or any(v != v for v in losses)):
        problems.append(f"the ranks report different (or no) losses {sorted(losses)}: reduce "
                        "the metrics with dist.all_reduce (a tensor on the training device), "
                        "so every rank prints the global mean")
    return problems


def posed_two_hosts(engines_per_host: int = 2) -> RankMap:
    """A rank map of two hosts (``host-a``, ``host-b``) with ``engines_per_host`` ranks each,
    as :func:`course_utils.cluster.ranks.build_rank_map` makes it: there rank 2 is local rank
    0 on its host, which one host cannot show."""
    desc = {e: {"host": f"host-{'ab'[e // engines_per_host]}",
                "addr": f"10.0.0.{2 + e // engines_per_host}", "pid": 1000 + e, "gpus": 2,
                "node": f"host-{'ab'[e // engines_per_host]}"}
            for e in range(2 * engines_per_host)}
    return build_rank_map(desc, host_order=["host-a", "host-b"])


def device_problems(device_for: Callable[[Mapping[str, str], bool], Any],
                    ranks: RankMap | None = None) -> list[str]:
    """``device_for(env, cuda_available)`` on every rank of ``ranks`` (default: two posed hosts
    of two ranks): ``cuda:<LOCAL_RANK>`` with CUDA, ``cpu`` without."""
    ranks = ranks or posed_two_hosts()
    problems = []
    for r in ranks:
        env = {**r.as_env(), "MASTER_PORT": "29500"}
        for cuda, want in ((True, f"cuda:{r.local_rank}"), (False, "cpu")):
            try:
                got = str(device_for(dict(env), cuda))
            except Exception as exc:  # noqa: BLE001 - shown to the learner
                got = f"{type(exc).__name__}: {exc}"
            if got != want:
                problems.append(
                    f"rank {r.rank} on {r.host} (local rank {r.local_rank}), CUDA "
                    f"{'available' if cuda else 'not available'}: device_for gave {got}, "
                    f"expected {want}. A host numbers its GPUs from 0: pick the GPU by "
                    "LOCAL_RANK, not RANK" if cuda else
                    f"rank {r.rank}, no CUDA: device_for gave {got}, expected cpu")
    return problems


def _flags(argv: Sequence[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` pairs (``_`` and ``-`` alike) up to the script."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            break
        name, eq, value = a.partition("=")
        name = name.replace("_", "-")
        if not eq and name != "--standalone":
            i += 1
            value = argv[i] if i < len(argv) else ""
        out[name] = value
        i += 1
    out["_script"] = argv[i] if i < len(argv) else ""
    return out


def _is_var(value: str, *names: str) -> bool:
    return any(f"${n}" in value or f"${{{n}}}" in value for n in names)


def line_problems(line: str, script: str = "train_ddp.py", nnodes: int = 2) -> list[str]:
    """What the learner's multi-node ``torchrun`` line gets wrong, flag by flag: ``--nnodes``,
    ``--nproc-per-node $NPROC_PER_NODE``, and either the c10d rendezvous (``--rdzv-backend
    c10d --rdzv-endpoint $RDZV_ENDPOINT``) or the static one (``--master-addr $MASTER_ADDR
    --master-port $MASTER_PORT --node-rank $NODE_RANK``), then the script."""
    if not isinstance(line, str) or not line.strip():
        return ["TORCHRUN_LINE must be the torchrun command line, as a string"]
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        return [f"TORCHRUN_LINE is not one shell command line: {exc}"]
    if argv[:3] in (["python", "-m", "torch.distributed.run"],
                    ["python3", "-m", "torch.distributed.run"]):
        argv = ["torchrun", *argv[3:]]
    if not argv or os.path.basename(argv[0]) != "torchrun":
        return [f"the line must start with torchrun, not {argv[0]!r}"]
    f = _flags(argv[1:])
    problems = []
    if "--standalone" in f:
        problems.append("--standalone makes a one-node job: several nodes meet through a "
                        "rendezvous (--rdzv-backend c10d --rdzv-endpoint $RDZV_ENDPOINT)")
    if f.get("--nnodes") not in (str(nnodes), f"{nnodes}:{nnodes}"):
        problems.append(f"--nnodes is {f.get('--nnodes')!r}: this job has {nnodes} nodes, so "
                        f"--nnodes {nnodes} on every node (with 1, each node forms a job of its "
                        "own, or waits for ever for a place in one)")
    if not _is_var(f.get("--nproc-per-node", ""), "NPROC_PER_NODE"):
        problems.append(f"--nproc-per-node is {f.get('--nproc-per-node')!r}: take it from "
                        "$NPROC_PER_NODE (the ranks per host of the rank map)")
    c10d = f.get("--rdzv-backend") == "c10d" or "--rdzv-endpoint" in f
    static = "--master-addr" in f or "--node-rank" in f
    if c10d:
        if f.get("--rdzv-backend") != "c10d":
            problems.append("say --rdzv-backend c10d with --rdzv-endpoint")
        if not _is_var(f.get("--rdzv-endpoint", ""), "RDZV_ENDPOINT", "MASTER_ADDR"):
            problems.append(f"--rdzv-endpoint is {f.get('--rdzv-endpoint')!r}: the store on "
                            "node 0, $RDZV_ENDPOINT (the same on every node)")
    elif static:
        for flag, var in (("--master-addr", "MASTER_ADDR"), ("--master-port", "MASTER_PORT"),
                          ("--node-rank", "NODE_RANK")):
            if not _is_var(f.get(flag, ""), var):
                problems.append(f"{flag} is {f.get(flag)!r}: use ${var} (set per node; a typed "
                                "node rank would make every node node 0)")
    else:
        problems.append("the nodes must find each other: --rdzv-backend c10d --rdzv-endpoint "
                        "$RDZV_ENDPOINT (or --master-addr $MASTER_ADDR --master-port "
                        "$MASTER_PORT --node-rank $NODE_RANK)")
    if os.path.basename(f["_script"]) != script:
        problems.append(f"the line must run {script} (found {f['_script']!r} where the script "
                        "goes, after the flags)")
    return problems


def node_env(node_rank: int, nproc: int, master_addr: str, port: int,
             node_addr: str | None = None) -> dict[str, str]:
    """The variables of :data:`LINE_VARIABLES` on node ``node_rank``."""
    return {"NPROC_PER_NODE": str(nproc), "NODE_RANK": str(node_rank),
            "NODE_ADDR": node_addr or master_addr, "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port), "RDZV_ENDPOINT": f"{master_addr}:{port}",
            "IS_HOST": "1" if node_rank == 0 else "0"}


def run_line_as_nodes(line: str, args: Sequence[str] = (), nnodes: int = 2, nproc: int = 1,
                      timeout: float = 300, cwd: str | os.PathLike[str] | None = None,
                      addrs: Sequence[str] | None = None, popens: Sequence[Popen] | None = None,
                      env: Mapping[str, str] | None = None) -> ScriptRun:
    """Run ``line`` (with ``args`` appended) once per node, all at once, each with its
    :func:`node_env`. Without ``addrs``/``popens`` every node is this machine (loopback):
    ``nnodes`` torchruns of ``nproc`` processes, so rank and local rank differ from node 1 on.
    ``popens[i]`` starts node ``i``'s process (the two-host tests: in that host)."""
    addrs = list(addrs or ["127.0.0.1"] * nnodes)
    port = free_port(addrs[0] if addrs[0].startswith("127.") else "")
    tr = torchrun_path()
    cmd = f'torchrun() {{ {shlex.quote(tr)} "$@"; }}; {line} "$@"'
    argvs = [["bash", "-c", cmd, "bash", *args] for _ in range(nnodes)]
    envs = [_env({**(env or {}), **node_env(i, nproc, addrs[0], port, addrs[i])})
            for i in range(nnodes)]
    return _run(argvs, envs, timeout, cwd, popens)


def batch_script(lines: Sequence[str], profile: Any = "slurm",
                 script_args: Sequence[str] = ()) -> str:
    """The whole batch script around the learner's key lines (their ``#SBATCH`` lines and
    ``srun`` line; see :func:`course_utils.cluster.launchers.slurm_script.make_sbatch_script`),
    ``script_args`` appended to the srun line."""
    from ..cluster.launchers.slurm_script import make_sbatch_script

    extra = " ".join(shlex.quote(a) for a in script_args)
    own = [f"{ln} {extra}".rstrip() if ln.strip().startswith("srun") else ln for ln in lines]
    return make_sbatch_script(profile, learner_lines=own)


def batch_problems(lines: Any, script: str = "train_ddp.py", nodes: int = 2) -> list[str]:
    """What the learner's batch-script lines get wrong: ``#SBATCH --nodes``, one task per
    node, one ``srun ... torchrun`` line with ``--nnodes`` matching, ``$NPROC_PER_NODE``,
    the c10d rendezvous on ``$RDZV_ENDPOINT``; then the script's syntax (``bash -n``)."""
    from ..cluster.launchers.slurm_script import check_sbatch_script

    if not isinstance(lines, list | tuple) or not all(isinstance(x, str) for x in lines):
        return ["SBATCH_LINES must be a list of strings: #SBATCH lines and one srun line"]
    problems = []
    sb: dict[str, str] = {}
    for ln in lines:
        m = re.match(r"\s*#SBATCH\s+--([\w-]+)=(\S+)", ln)
        if m:
            sb[m[1]] = m[2]
    if sb.get("nodes") != str(nodes):
        problems.append(f"#SBATCH --nodes={sb.get('nodes')}: this job needs "
                        f"'#SBATCH --nodes={nodes}' (written with '=')")
    if sb.get("ntasks-per-node") != "1":
        problems.append(f"#SBATCH --ntasks-per-node={sb.get('ntasks-per-node')}: write "
                        "'#SBATCH --ntasks-per-node=1': one task per node, its torchrun "
                        "starts the training processes")
    sruns = [ln for ln in lines if ln.strip().startswith("srun")]
    if len(sruns) != 1:
        return [*problems, f"expected one srun line, found {len(sruns)}"]
    argv = shlex.split(sruns[0].replace('"', ""))
    tr = next((i for i, a in enumerate(argv) if os.path.basename(a) == "torchrun"), None)
    if tr is None:
        return [*problems, "the srun line must run torchrun (srun ... torchrun ... "
                f"{script})"]
    own = _flags(argv[1:tr] + ["torchrun"])
    if own.get("--ntasks-per-node", "1") != "1" or "--ntasks" in own or "-n" in argv[1:tr]:
        problems.append("srun must start one task per node (it runs torchrun, which starts the "
                        "processes): leave --ntasks out, or --ntasks-per-node=1")
    f = _flags(argv[tr + 1:])
    if f.get("--nnodes") not in (str(nodes), "$SLURM_NNODES", "$SLURM_JOB_NUM_NODES"):
        problems.append(f"torchrun --nnodes is {f.get('--nnodes')!r}: use $SLURM_NNODES (the "
                        "nodes Slurm gave the job)")
    if not _is_var(f.get("--nproc-per-node", ""), "NPROC_PER_NODE"):
        problems.append(f"--nproc-per-node is {f.get('--nproc-per-node')!r}: use "
                        "$NPROC_PER_NODE (the script exports it)")
    if f.get("--rdzv-backend") != "c10d" or not (
            _is_var(f.get("--rdzv-endpoint", ""), "RDZV_ENDPOINT", "HEAD_NODE")):
        problems.append("torchrun needs --rdzv-backend c10d --rdzv-endpoint $RDZV_ENDPOINT "
                        "(the first node of the job, on a port free there)")
    if os.path.basename(f["_script"]) != script:
        problems.append(f"the srun line must run {script} after torchrun's flags")
    if not problems:
        check = check_sbatch_script(batch_script(lines), script=script)
        problems += check.errors
    return problems


def sbatch_test_only(text: str, timeout: float = 20) -> tuple[bool, str] | None:
    """``sbatch --test-only`` of ``text``: Slurm validates the job and says when it would start,
    submitting nothing. ``None`` when this machine has no ``sbatch``, no controller answers, or
    the controller that answers cannot grant what the example profile asks of its site (GPUs
    as GRES, a partition): that says nothing about the learner's lines."""
    import shutil

    if not shutil.which("sbatch"):
        return None
    try:
        cp = subprocess.run(["sbatch", "--test-only"], input=text, capture_output=True,
                            text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    said = (cp.stdout + cp.stderr).strip()
    if cp.returncode != 0 and re.search(r"contact slurm controller|Unable to contact|"
                                        r"slurm.conf|Could not establish", said, re.I):
        return None
    if cp.returncode != 0 and re.search(r"generic resource|gres|invalid partition|"
                                        r"node configuration is not available", said, re.I):
        return None
    return cp.returncode == 0, said


def script_device_problems(path: str | os.PathLike[str]) -> list[str]:
    """:func:`device_problems` of the script at ``path`` (its ``device_for``), or why the script
    does not load: what the notebook checks before it spends time running the script."""
    try:
        module = load_script(path)
        device_for = module.device_for
    except Exception as exc:  # noqa: BLE001 - the learner's code: shown, not raised
        return [f"{Path(path).name} does not load ({type(exc).__name__}: {exc}): run its "
                "%%writefile cell after writing device_for, reduce_metrics and main"]
    return device_problems(device_for)
