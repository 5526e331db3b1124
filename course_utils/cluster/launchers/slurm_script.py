"""From notebook to batch job: the ``torchrun`` line and a Slurm batch script, from a profile.

Introduced in ``06_two_hosts``. The training code is unit 3's by default, packaged as
``python -m course_utils.torch_dist.ddp_script`` (``module=`` runs another); what changes
between a laptop, two SSH hosts and a Slurm cluster is only who starts the processes:

* :func:`torchrun_args`: one ``torchrun`` per host (multi-node flags, c10d rendezvous);
* :func:`make_sbatch_script`: an ``sbatch`` script whose ``srun`` starts that same ``torchrun``
  once per node, with the interface, interpreter and node count taken from a cluster profile
  (submitted for real to a one-node Slurm cluster by ``tests/test_slurm.py``);
* :func:`check_sbatch_script`: what can be checked without Slurm (``bash -n``, the ``#SBATCH``
  lines, the ``srun ... torchrun ... -m course_utils.torch_dist.ddp_script`` line).

Pure functions: nothing here imports torch or talks to a cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...settings import ENV_THREADS
from ..profiles import ClusterProfile, load_profile

#: The module every launcher runs: unit 3's training as a script.
SCRIPT_MODULE = "course_utils.torch_dist.ddp_script"
#: torchrun's usual port for the c10d rendezvous store (the examples' ``--rdzv-endpoint``).
RDZV_PORT = 29400

#: Bash that prints a TCP port free on this node right now (the batch script runs on the
#: allocation's first node, where the rendezvous store listens), picked as the course picks
#: every port (below the ephemeral range: see cluster/ports.py). ``{python}``: the interpreter.
_FREE_PORT = ("{python} -c 'from course_utils.cluster.ports import free_port; "
              "print(free_port(\"\"))'")


def torchrun_args(nnodes: int, nproc_per_node: int, rdzv_endpoint: str, *,
                  rdzv_id: str = "course", torchrun: str = "torchrun",
                  module: str = SCRIPT_MODULE, script_args: Sequence[str] = (),
                  max_restarts: int = 0, local_addr: str | None = None,
                  is_host: bool | None = None, script: str | None = None) -> list[str]:
    """The ``torchrun`` argv that every node runs (the same line on each node).

    ``rdzv_endpoint`` is ``host:port`` of the c10d store (on the first node); ``nnodes=1``
    works too (a one-host run with the same flags). ``local_addr``: this node's address on the
    shared link; without it torchrun advertises the node's host name, which the other nodes
    must resolve to that address (cloned hosts sharing a name resolve it to themselves).
    ``is_host``: whether this node runs the c10d store. torchrun decides it by comparing the
    endpoint with the node's host name and addresses; hosts that share a host name, or an
    endpoint given as an address the name does not resolve to, need it said explicitly.
    ``script``: a script file to run instead of ``-m module`` (unit 6's ``train_ddp.py``).
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes={nnodes} and nproc_per_node={nproc_per_node} must be >= 1")
    if ":" not in rdzv_endpoint:
        raise ValueError(f"rdzv_endpoint {rdzv_endpoint!r} must be host:port")
    return [
        torchrun, f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}",
        f"--max-restarts={max_restarts}",
        *([f"--local-addr={local_addr}"] if local_addr else []),
        *([f"--rdzv-conf=is_host={int(is_host)}"] if is_host is not None else []),
        *([script] if script else ["-m", module]), *script_args,
    ]


def _venv_tool(python: str, tool: str) -> str:
    """``tool`` next to ``python`` (a venv's bin/), else the bare name (found on PATH)."""
    p = Path(python)
    return str(p.parent / tool) if p.is_absolute() else tool


@dataclass(frozen=True)
class _Job:
    """What the batch script asks for, the profile's defaults and the overrides resolved."""

    nodes: int
    nproc: int
    python: str
    cpus: int | None
    time: str
    resources: tuple[str, ...]  # CPUs, GPUs, partition, account
    extra: tuple[str, ...]      # the profile's qos and options, the caller's extra_sbatch


def _job(prof: ClusterProfile, nodes: int | None, nproc_per_node: int | None,
         gpus_per_node: int | None, cpus_per_task: int | None, time_limit: str | None,
         partition: str | None, account: str | None, python: str | None,
         extra_sbatch: Sequence[str]) -> _Job:
    spec = prof.slurm
    if nodes is None:
        nodes = len(prof.hosts) if prof.hosts else (spec.nodes if spec and spec.nodes else 1)
    if nproc_per_node is not None:
        nproc = nproc_per_node
    elif prof.hosts:
        nproc = max(h.engines for h in prof.hosts)
    elif prof.launcher == "slurm" and prof.engines and isinstance(nodes, int) and nodes > 0:
        nproc = -(-prof.engines // nodes)
    else:
        nproc = prof.engines or 2
    for name, value in (("nodes", nodes), ("nproc_per_node", nproc)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    python = python or next((h.python for h in prof.hosts if h.python), None) \
        or prof.engine_python or sys.executable
    if gpus_per_node is None and spec and spec.gpus_per_engine:
        gpus_per_node = spec.gpus_per_engine * nproc
    if not cpus_per_task and spec and spec.cpus_per_engine:
        cpus_per_task = spec.cpus_per_engine * nproc
    sb = []
    partition = partition or (spec.partition if spec else None)
    account = account or (spec.account if spec else None)
    if cpus_per_task:
        sb.append(f"--cpus-per-task={int(cpus_per_task)}")
    if gpus_per_node:
        sb.append(f"--gpus-per-node={int(gpus_per_node)}")
    if partition:
        sb.append(f"--partition={partition}")
    if account:
        sb.append(f"--account={account}")
    extra = list(extra_sbatch)
    if spec and spec.qos:
        extra = [f"--qos={spec.qos}", *extra]
    if spec and spec.options:
        extra = [*extra, *spec.options]
    return _Job(nodes, nproc, python, cpus_per_task,
                time_limit or (spec.time if spec else None) or "00:15:00", tuple(sb), tuple(extra))


def _job_env(prof: ClusterProfile, job: _Job) -> dict[str, str]:
    """The profile's environment, its interface names, and a thread budget per process."""
    env = {k: str(v) for k, v in prof.env.items()}
    if prof.socket_ifname:
        env.setdefault("GLOO_SOCKET_IFNAME", prof.socket_ifname)
        env.setdefault("NCCL_SOCKET_IFNAME", prof.socket_ifname)
    threads = max(1, int(job.cpus) // job.nproc) if job.cpus else 1
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault(ENV_THREADS, str(threads))
    return env


def _run_lines(job: _Job, module: str, script_args: Sequence[str], rdzv_port: int | None,
               rdzv_host: str | None) -> list[str]:
    """Rendezvous host and port, then the one ``srun`` line that starts torchrun per node."""
    torchrun = _venv_tool(job.python, "torchrun")
    port = "$RDZV_PORT" if rdzv_port is None else str(int(rdzv_port))
    endpoint = f"{rdzv_host or '$HEAD_NODE'}:{port}"
    run = torchrun_args(job.nodes, job.nproc, endpoint, rdzv_id="$SLURM_JOB_ID",
                        torchrun=torchrun, module=module, script_args=script_args)
    # $VARIABLES must expand in the script: quote everything else.
    run_line = " ".join(a if "$" in a else shlex.quote(a) for a in run)
    for var in ("HEAD_NODE", "RDZV_PORT", "SLURM_JOB_ID"):
        run_line = re.sub(rf"([=:])\${var}\b", rf'\1"${var}"', run_line)
    if rdzv_port is None:
        port_lines = ["# ... on a port free there now (the batch script runs on that node):",
                      "# a fixed port clashes with another job's rendezvous on the same node.",
                      f"RDZV_PORT=$({_FREE_PORT.format(python=shlex.quote(job.python))})"]
    else:
        port_lines = [f"RDZV_PORT={int(rdzv_port)}"]
    return ["# The c10d rendezvous store listens on the first node of the allocation ...",
            'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            *port_lines,
            'echo "job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES node(s) ($SLURM_JOB_NODELIST)'
            f' x {job.nproc} process(es), rendezvous on $HEAD_NODE:$RDZV_PORT"',
            "# One task per node; each runs one torchrun, which starts the training processes.",
            f"srun --nodes={job.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {run_line}"]


def make_sbatch_script(
    profile: ClusterProfile | str | None = None,
    *,
    module: str = SCRIPT_MODULE,
    nodes: int | None = None,
    nproc_per_node: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    job_name: str = "course-ddp",
    time_limit: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    python: str | None = None,
    rdzv_port: int | None = None,
    rdzv_host: str | None = None,
    script_args: Sequence[str] = ("--steps", "20"),
    output: str = "course-ddp-%j.out",
    workdir: str | None = None,
    extra_sbatch: Sequence[str] = (),
    learner_lines: Sequence[str] | None = None,
) -> str:
    """A Slurm batch script that runs ``python -m module`` with ``srun`` + ``torchrun``.

    ``module`` defaults to unit 3's training (:data:`SCRIPT_MODULE`); any module that reads
    torchrun's environment (``RANK``, ``WORLD_SIZE``, ...) works. ``script_args`` are its
    arguments. Defaults come from ``profile`` (a :class:`ClusterProfile`, a profile name or
    path, or the local profile): nodes = its hosts (a slurm profile: ``[slurm] nodes``),
    processes per node = its engines per host (a slurm profile: engines / nodes), the engine
    interpreter (its ``torchrun`` is the one next to it), ``socket_ifname`` exported as
    ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``, its ``env`` table, and a slurm profile's
    ``partition``, ``account``, ``qos``, ``time``, ``options`` and per-engine CPUs/GPUs (times
    the processes per node). Keyword arguments override them. One ``srun`` task per node
    starts one ``torchrun``, which starts ``nproc_per_node`` processes; the c10d rendezvous
    store listens on the first node of the allocation (``rdzv_host`` overrides it), on a port
    the batch script finds free there (``rdzv_port`` fixes one: two jobs sharing a node must
    not use the same). ``output``: the job's log, relative to the directory ``sbatch`` runs
    in; every rank writes its JSON line there.

    ``learner_lines`` (unit 6, exercise 5): the learner's ``#SBATCH`` lines, which replace the
    script's own for the options they set, and the learner's ``srun`` line, which replaces the
    generated one; the script then also exports ``NPROC_PER_NODE`` (from the profile) and
    ``RDZV_ENDPOINT`` (``$HEAD_NODE:$RDZV_PORT``) and puts the interpreter's folder first on
    ``PATH``, so that a bare ``torchrun`` is the venv's.
    """
    prof = load_profile(profile) if not isinstance(profile, ClusterProfile) else profile
    job = _job(prof, nodes, nproc_per_node, gpus_per_node, cpus_per_task, time_limit,
               partition, account, python, extra_sbatch)
    if not re.fullmatch(r"[\w.+-]+", job_name):
        raise ValueError(f"job_name {job_name!r}: use letters, digits, . _ + -")
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"module {module!r} is not a Python module name")
    sb = [f"--job-name={job_name}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
          f"--time={job.time}", f"--output={output}", *job.resources,
          *([f"--chdir={workdir}"] if workdir else []), *job.extra]
    what = "Unit 3's DDP training" if module == SCRIPT_MODULE else f"python -m {module}"
    body = _run_lines(job, module, script_args, rdzv_port, rdzv_host)
    if learner_lines is not None:
        own = [ln.strip() for ln in learner_lines if ln.strip().startswith("#SBATCH")]
        given = {re.split(r"[= ]", ln.split(None, 1)[1])[0] for ln in own if len(ln.split()) > 1}
        sb = [*(o.split(None, 1)[1] for o in own),
              *(o for o in sb if o.split("=")[0] not in given)]
        runs = [ln.strip() for ln in learner_lines if not ln.strip().startswith("#SBATCH")]
        bindir = os.path.dirname(job.python) if os.path.isabs(job.python) else ""
        body = [*body[:-1], f"export NPROC_PER_NODE={job.nproc}",
                'export RDZV_ENDPOINT="$HEAD_NODE:$RDZV_PORT"',
                *([f'export PATH={shlex.quote(bindir)}:"$PATH"'] if bindir else []), *runs]
        what = "your training script"
    lines = ["#!/bin/bash",
             f"# {what} on {job.nodes} node(s) x {job.nproc} process(es), made by",
             f"# course_utils.cluster.launchers.slurm_script from profile {prof.name!r}. "
             "Submit: sbatch FILE",
             f"# (the log, one JSON line per rank at the end, goes to {output} in the",
             "# directory sbatch runs in; %j is the job id).",
             *(f"#SBATCH {s}" for s in sb),
             "",
             "set -euo pipefail",
             *(f"export {k}={shlex.quote(v)}" for k, v in sorted(_job_env(prof, job).items())),
             *body,
             ""]
    return "\n".join(lines)


@dataclass
class ScriptCheck:
    """What :func:`check_sbatch_script` found: errors (empty when fine) and the parsed parts."""

    errors: list[str] = field(default_factory=list)
    sbatch: dict[str, str] = field(default_factory=dict)
    srun_line: str = ""
    torchrun: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def check_sbatch_script(text: str, bash: str | None = None,
                        expect: Mapping[str, str] | None = None,
                        module: str = SCRIPT_MODULE, script: str | None = None) -> ScriptCheck:
    """Check a batch script without Slurm: ``bash -n`` syntax, ``#SBATCH`` options, and one
    ``srun ... torchrun ... -m MODULE`` line with c10d flags (``module``: unit 3's training
    unless said otherwise).

    ``expect`` maps ``#SBATCH`` option names (``"nodes"``) or torchrun flags (``"--nnodes"``)
    to the values they must have. ``script``: the srun line must run that script file instead
    of ``-m module`` (unit 6's ``train_ddp.py``). Flags may be ``--flag=value`` or ``--flag
    value``; ``--nnodes`` may be ``$SLURM_NNODES``.
    """
    res = ScriptCheck()
    bash = bash or shutil.which("bash") or "/bin/bash"
    cp = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True, timeout=10)
    if cp.returncode != 0:
        res.errors.append(f"bash -n: {cp.stderr.strip()}")
    if not text.startswith("#!"):
        res.errors.append("no #! line")
    for line in text.splitlines():
        m = re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line)
        if m:
            res.sbatch[m.group(1)] = m.group(2) or ""
    sruns = [ln for ln in text.splitlines() if ln.strip().startswith("srun ")]
    if len(sruns) != 1:
        res.errors.append(f"expected one srun line, found {len(sruns)}")
        return res
    res.srun_line = sruns[0].strip()
    argv = shlex.split(res.srun_line.replace('"', ""))
    tr = next((i for i, a in enumerate(argv) if os.path.basename(a) == "torchrun"), None)
    if tr is None:
        res.errors.append("the srun line runs no torchrun")
        return res
    rest, i = argv[tr + 1:], 0
    while i < len(rest) and rest[i].startswith("--"):
        k, eq, v = rest[i].partition("=")
        if not eq and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            i, v = i + 1, rest[i + 1]
        res.torchrun[k.replace("_", "-")] = v
        i += 1
    if script is not None:
        if i >= len(rest) or os.path.basename(rest[i]) != script:
            res.errors.append(f"torchrun does not run {script}")
    elif argv[tr + 1:].count("-m") != 1 or module not in argv:
        res.errors.append(f"torchrun does not run -m {module}")
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint",
                 "--rdzv-id"):
        if flag not in res.torchrun:
            res.errors.append(f"torchrun lacks {flag}")
    if res.torchrun.get("--rdzv-backend", "c10d") != "c10d":
        res.errors.append("use --rdzv-backend=c10d")
    if res.sbatch.get("nodes") and res.torchrun.get("--nnodes") not in (
            res.sbatch["nodes"], "$SLURM_NNODES", "$SLURM_JOB_NUM_NODES"):
        res.errors.append(f"torchrun --nnodes={res.torchrun.get('--nnodes')} but "
                          f"#SBATCH --nodes={res.sbatch['nodes']}")
    if res.sbatch.get("ntasks-per-node", "1") != "1":
        res.errors.append("use one srun task per node: torchrun starts the processes")
    for key, want in (expect or {}).items():
        got = res.torchrun.get(key) if key.startswith("--") else res.sbatch.get(key)
        if got != want:
            res.errors.append(f"{key}: {got!r}, expected {want!r}")
    return res


def write_sbatch_script(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` (executable) and return the path."""
    p = Path(path)
    p.write_text(text)
    p.chmod(0o755)
    return p
