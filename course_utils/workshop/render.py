"""``course workshop FILE --out DIR``: the workshop file turned into the files the parts read.

=========================  ====================================================================
``slurm-workshop.conf``    lines for ``slurm.conf``: GPUs as GRES, one node line per host, the
                           partition
``gres.conf``              each node's GPU device files (and ``shard`` counts when shared)
``learner-profile.toml``   the learners' cluster profile: ``cu.start()`` submits the learner's
                           engines as one Slurm job, ``gpus_per_learner`` GPUs on every host
``jupyterhub_config.py``   JupyterHub: OS users (PAM), one JupyterLab per learner on the hub
                           host, the profile above in every learner's environment
``learner-env/``           the learners' Python: the course's code without the source notebooks
                           (:mod:`course_utils.workshop.learner_env`); the labs run in it
=========================  ====================================================================

A learner's lab holds no GPU: Slurm hands a learner GPUs when their ``cu.start()`` submits the
engines, and takes them back at ``cu.stop()``; a learner who starts while every GPU is held
waits in Slurm's queue and is told who holds what (:mod:`course_utils.workshop.queue`).
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import sys
from pathlib import Path

from ..learner.labconfig import QUIET_ARGS
from ..settings import ENV_PORTS, ENV_PROFILE, ENV_WORKSHOP
from .learner_env import FOLDER, build_learner_env
from .plan import Workshop

HUB_API_PORT = 8081     # the hub's own API, on loopback (the labs run on the hub host)
PROXY_API_PORT = 8001   # configurable-http-proxy's API, on loopback
CHECK_SERVICE = "course-check"
CHECK_TOKEN_FILE = "hub-state/check-token"
"""The API token of the hub service that ``course workshop check`` uses to spawn a test
learner (readable by the instructor only)."""


def slurm_lines(ws: Workshop) -> str:
    """What ``slurm.conf`` needs for the workshop: GRES types, nodes, the partition."""
    types = "gpu,shard" if ws.shared else "gpu"
    lines = [f"# course workshop ({ws.path or 'workshop file'}): merge into slurm.conf",
             f"GresTypes={types}",
             "SelectType=select/cons_tres"]
    for h in ws.hosts:
        gres = f"gpu:{h.gpus}" + (f",shard:{h.gpus * ws.shards_per_gpu}" if ws.shared else "")
        cpus = f" CPUs={h.cpus}" if h.cpus else ""
        lines.append(f"NodeName={h.name} NodeAddr={h.address}{cpus} Gres={gres} State=UNKNOWN")
    lines.append(f"PartitionName={ws.partition} Nodes={','.join(h.name for h in ws.hosts)} "
                 f"MaxTime={ws.time} State=UP")
    per_user = ws.gpus_per_learner * len(ws.hosts)
    lines += [
        "# Replace, do not add: where slurm.conf already has a NodeName line for one of these",
        "# hosts, or this PartitionName, edit that line (Slurm refuses a node defined twice).",
        "# Fencing: a job sees only the GPUs, cores and memory it was given (cgroup.conf,",
        "# written beside this file, turns each constraint on).",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectTypeParameters=CR_Core_Memory",
        "# One learner holds at most their own GPUs: a QOS limit, which needs accounting",
        "# (slurmdbd). With it, run once:",
        f"#   sacctmgr -i add qos {ws.partition} MaxTRESPerUser=gres/gpu={per_user} "
        "MaxJobsPerUser=2",
        f"# and add QOS={ws.partition} to the PartitionName line above, and",
        "#   AccountingStorageEnforce=limits,qos",
    ]
    return "\n".join(lines) + "\n"


def cgroup_conf(ws: Workshop) -> str:
    """``cgroup.conf`` for the fencing lines of :func:`slurm_lines`: devices (the GPUs),
    cores and memory constrained to what each job was given."""
    return "\n".join([f"# course workshop ({ws.path or 'workshop file'}): beside slurm.conf",
                      "ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes",
                      ""])


def gres_conf(ws: Workshop) -> str:
    """``gres.conf``: ``File=`` is required for typed GPU GRES; shards are counted per node."""
    lines = [f"# course workshop ({ws.path or 'workshop file'})", "AutoDetect=off"]
    for h in ws.hosts:
        lines.append(f"NodeName={h.name} Name=gpu File={h.gpu_file_pattern}")
        if ws.shared:
            lines.append(f"NodeName={h.name} Name=shard Count={h.gpus * ws.shards_per_gpu}")
    return "\n".join(lines) + "\n"


def learner_profile(ws: Workshop) -> str:
    """The learners' cluster profile (TOML; :func:`course_utils.cluster.profiles.load_profile`
    reads it): one engine per GPU, ``gpus_per_learner`` of them on each host."""
    options = [f"--ntasks-per-node={ws.gpus_per_learner}"]  # job name: ipengine-<cluster id>
    if ws.reservation:
        options.append(f"--reservation={ws.reservation}")
    if ws.shared:
        options.append(f"--gres=shard:{ws.gpus_per_learner}")
    lines = ["# course workshop: the learners' cluster (COURSE_PROFILE points here)",
             'launcher = "slurm"',
             f"controller_ip = {json.dumps(ws.hub.address)}   # the hub host: the labs run there",
             *( [f"socket_ifname = {json.dumps(ws.interface)}"] if ws.interface else []),
             f"engines = {ws.ranks_per_learner}",
             "",
             "[slurm]",
             f"partition = {json.dumps(ws.partition)}",
             f"time = {json.dumps(ws.time)}",
             f"nodes = {len(ws.hosts)}",
             f"gpus_per_engine = {0 if ws.shared else 1}",
             f"options = {json.dumps(options)}"]
    return "\n".join(lines) + "\n"


def lab_command(ws: Workshop, python: str) -> list[str]:
    """The command of a learner's lab: JupyterHub's single-user server under ``prlimit``
    (util-linux) when the workshop caps a learner's processes."""
    lab = [str(python), "-m", "jupyterhub.singleuser"]
    if not ws.max_processes:
        return lab
    return [shutil.which("prlimit") or "/usr/bin/prlimit", f"--nproc={ws.max_processes}", "--",
            *lab]


def hub_config(ws: Workshop, profile: Path, release: Path, state: Path,
               python: str = sys.executable) -> str:
    """``jupyterhub_config.py``: the hub on the hub host's workshop address, everything else on
    loopback; PAM login for the learners (OS users); each learner's lab starts in their own copy
    of the student release (:func:`course_utils.workshop.hub.provision`) and runs ``python``
    (the learners' environment)."""
    bin_dir = Path(python).parent
    admins = {ws.instructor} if ws.instructor else set()
    blocks = {who: "-".join(map(str, ws.port_block(who))) for who in ws.learners}
    env = {ENV_PROFILE: str(profile), ENV_WORKSHOP: ws.path,
           "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",  # their `course`, not ours
           **({"SLURM_CONF": ws.slurm_conf} if ws.slurm_conf else {})}
    return "\n".join([
        "# Generated by `course workshop`: edit the workshop file and run it again.",
        "from course_utils.workshop.hub import port_blocks, provision",
        "",
        "c = get_config()  # noqa: F821 (JupyterHub defines it)",
        f"c.JupyterHub.bind_url = {json.dumps(ws.hub_url)}",
        *([f"c.JupyterHub.ssl_cert = {json.dumps(ws.ssl_cert)}",
           f"c.JupyterHub.ssl_key = {json.dumps(ws.ssl_key)}"] if ws.ssl_cert else []),
        f'c.JupyterHub.hub_bind_url = "http://127.0.0.1:{HUB_API_PORT}"',
        f'c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{PROXY_API_PORT}"',
        f"c.JupyterHub.db_url = {json.dumps('sqlite:///' + str(state / 'jupyterhub.sqlite'))}",
        f"c.JupyterHub.cookie_secret_file = {json.dumps(str(state / 'cookie_secret'))}",
        f"c.ConfigurableHTTPProxy.pid_file = {json.dumps(str(state / 'proxy.pid'))}",
        'c.JupyterHub.authenticator_class = "pam"',
        f"c.Authenticator.allowed_users = {sorted(ws.learners)!r}",
        f"c.Authenticator.admin_users = {sorted(admins)!r}",
        "# JupyterHub's local-process spawner, the lab joining the learner's memory cgroup",
        "# (course-labs/<learner>) before it drops root: lab and kernels share the limit",
        'c.JupyterHub.spawner_class = "course_utils.workshop.lab_spawner.LimitedSpawner"',
        f"c.LimitedSpawner.memory_max = {ws.max_memory}",
        "# prlimit: RLIMIT_NPROC caps the learner's processes and threads on this host (a fork",
        "# bomb stops there); their kernels inherit it, and their Slurm jobs (Slurm propagates",
        "# a submitter's limits by default)",
        f"c.Spawner.cmd = {lab_command(ws, python)!r}",
        'c.Spawner.default_url = "/lab"',
        f"c.Spawner.args = {list(QUIET_ARGS)!r}  # no news question, no update check",
        'c.Spawner.notebook_dir = "~/course"',
        f"c.Spawner.environment = {env!r}",
        "# each learner's own ports, closed to the others by firewall.nft",
        f"c.Spawner.environment[{ENV_PORTS!r}] = port_blocks({blocks!r})",
        f"c.Spawner.start_timeout = {ws.lab_start_timeout}",
        f"c.Spawner.http_timeout = {ws.lab_start_timeout}",
        f"c.Spawner.pre_spawn_hook = provision({json.dumps(str(release))})",
        "# `course workshop check` starts and stops a test learner's lab with this service",
        f"c.JupyterHub.services = [{{'name': {CHECK_SERVICE!r}, 'api_token': "
        f"open({str(state / 'check-token')!r}).read().strip()}}]",
        f"c.JupyterHub.load_roles = [{{'name': {CHECK_SERVICE!r}, 'services': "
        f"[{CHECK_SERVICE!r}], 'scopes': ['servers', 'read:users', 'tokens']}}]",
        "",
    ])


#: The nftables table ``firewall.nft`` (re)defines on each host.
FIREWALL_TABLE = "course_workshop"


def firewall_nft(ws: Workshop) -> str:
    """``firewall.nft``, loaded on every host (``nft -f firewall.nft``, as root): a connection
    to a port of a learner's block is refused unless the learner's own process makes it, on
    any host (the same users on every host). The socket's owner is what the kernel knows of a
    local process, so no learner can pass for another; torch's store has no authentication of
    its own. Loading it again replaces the table."""
    rules = [f"        tcp dport {lo}-{hi} meta skuid != {json.dumps(who)} reject with tcp reset"
             for who in ws.learners for lo, hi in [ws.port_block(who)]]
    return "\n".join([
        "#!/usr/sbin/nft -f",
        "# Generated by `course workshop`: each learner's ports are theirs alone.",
        f"table inet {FIREWALL_TABLE}",
        f"delete table inet {FIREWALL_TABLE}",
        f"table inet {FIREWALL_TABLE} {{",
        "    chain output {",
        "        type filter hook output priority 0; policy accept;",
        *rules,
        "    }",
        "}",
        "",
    ])


def write_workshop(ws: Workshop, out: Path, release: Path) -> dict[str, Path]:
    """Write every file into ``out`` (made if needed), and the learners' environment; name ->
    path."""
    out.mkdir(parents=True, exist_ok=True)
    python = build_learner_env(out)
    state = out / "hub-state"
    state.mkdir(mode=0o700, exist_ok=True)
    token = out / CHECK_TOKEN_FILE
    if not token.exists():
        token.touch(mode=0o600)
        token.write_text(secrets.token_hex(32) + "\n")
    files = {"slurm-workshop.conf": slurm_lines(ws), "gres.conf": gres_conf(ws),
             "cgroup.conf": cgroup_conf(ws),
             "learner-profile.toml": learner_profile(ws), "firewall.nft": firewall_nft(ws)}
    files["jupyterhub_config.py"] = hub_config(ws, (out / "learner-profile.toml").resolve(),
                                               release.resolve(), state.resolve(),
                                               python=str(python))
    written = {}
    for name, text in files.items():
        (out / name).write_text(text)
        (out / name).chmod(0o644)  # every learner's lab reads the profile
        written[name] = out / name
    written[FOLDER] = python.parent.parent
    return written


def next_steps(ws: Workshop, written: dict[str, Path]) -> str:
    """What the instructor does with the files, in order."""
    hub_cfg = shlex.quote(str(written["jupyterhub_config.py"]))
    return "\n".join([
        f"1. every host: merge {written['slurm-workshop.conf']} into slurm.conf, copy "
        f"{written['gres.conf']} and {written['cgroup.conf']} beside it, restart slurmctld "
        "and slurmd",
        f"2. every host: nft -f {shlex.quote(str(written['firewall.nft']))}  (each "
        "learner's ports closed to the others)",
        f"3. hub host ({ws.hub.name}): jupyterhub -f {hub_cfg}  (as root: PAM and the "
        "learners' own users)",
        f"4. check it: course workshop check {shlex.quote(ws.path)} --out "
        f"{shlex.quote(str(written['jupyterhub_config.py'].parent))}",
        f"the labs run in {written[FOLDER]} (the course's code, no source notebooks): on two "
        "hosts it must be at that path on both; keep your checkout closed (chmod 700 ~)",
        f"learners at once: {min(ws.capacity, len(ws.learners))} of {len(ws.learners)} "
        f"(GPUs for {ws.capacity})"
        + (f"; {ws.queued} wait in Slurm's queue when all start" if ws.queued else ""),
    ])
