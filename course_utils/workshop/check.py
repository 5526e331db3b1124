"""``course workshop check FILE``: the workshop's doctor. One line per check, each failure with
its fix, every check bounded in time; exit 0 only when nothing failed.

In order: Slurm answers; every host of the file is a node that is up; each node's GRES is what
the file says; the partition holds every host; a test learner's ranks (one Slurm step with the
learner's request) land on every host with distinct GPUs; the first learner has the same uid on
every host and sees one home from all; that learner can neither read nor
find the source notebooks, nor read the course folder's sources, gradebook, submissions and
feedback; this host's firewall closes each learner's ports to the others (and nothing else
listens in them); Slurm fences each job to its GPUs and a QOS limits each learner; the hub
answers; its TLS pair is sound (a WARN without one); given an admin API token (``--token`` or
``$JUPYTERHUB_API_TOKEN``), a test learner's lab spawns through the hub's REST API and is
stopped again; labs can start in a memory cgroup of their learner's; the grader's sandbox
starts here. A WARN names a risk and does not fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from ..cluster.launchers.slurm import SlurmError, parse_job, run_command
from .check_as_learner import check_course_folder, check_firewall, check_sources
from .check_line import Line
from .check_setup import (
    DEFAULT_SLURM_CONF,
    check_fencing,
    check_lab_memory,
    check_sandbox,
    check_tls,
)
from .plan import Workshop
from .render import CHECK_TOKEN_FILE

STEP_TIMEOUT_S = 60


def _records(kind: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show <kind>`` as name -> fields."""
    text = run_command(["scontrol", "-o", "show", kind], timeout=15)
    key = {"node": "NodeName", "partition": "PartitionName"}[kind]
    out = {}
    for line in text.splitlines():
        fields = parse_job(line).fields
        if key in fields:
            out[fields[key]] = fields
    return out


def check_slurm(ws: Workshop) -> Line:
    conf = os.environ.get("SLURM_CONF")
    named = "the workshop file's slurm_conf" if ws.slurm_conf else "SLURM_CONF"
    if conf and not os.path.isfile(conf):  # scontrol would retry for a minute
        return Line("slurm", "FAIL", f"{named} names {conf}, which does not exist",
                    f"point {named} at the cluster's slurm.conf, or unset it")
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15,
                              stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        return Line("slurm", "FAIL", "`scontrol` is not installed here",
                    "run the check on the hub host, where Slurm's clients are installed "
                    "(Debian: apt-get install slurm-client)")
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "no answer within 15 s")
    said = _one_line(done.stdout + "\n" + done.stderr)
    if " is UP" in said:
        return Line("slurm", "PASS", said)
    if not conf and not os.path.isfile(DEFAULT_SLURM_CONF):
        return Line("slurm", "FAIL", f"Slurm finds no configuration (SLURM_CONF is not set and "
                    f"{DEFAULT_SLURM_CONF} does not exist): {said}",
                    "set slurm_conf in the workshop file (or export SLURM_CONF) to the "
                    "cluster's slurm.conf")
    return Line("slurm", "FAIL", said,
                "start slurmctld on the head host (and check SlurmctldHost/SlurmctldPort in "
                "slurm.conf); `scontrol ping` must say UP")


def check_nodes(ws: Workshop) -> Line:
    nodes = _records("node")
    missing = [h.name for h in ws.hosts if h.name not in nodes]
    if missing:
        return Line("nodes", "FAIL", f"{missing} are not Slurm nodes (Slurm has {sorted(nodes)})",
                    "merge slurm-workshop.conf into slurm.conf and restart slurmctld")
    bad = {h.name: nodes[h.name].get("State", "?") for h in ws.hosts
           if re.search(r"DOWN|DRAIN|FAIL|NOT_RESPONDING", nodes[h.name].get("State", ""))}
    if bad:
        return Line("nodes", "FAIL", f"not usable: {bad}",
                    "start slurmd on those hosts; `scontrol update nodename=<n> state=resume`")
    states = ", ".join(f"{h.name} {nodes[h.name].get('State', '?')}" for h in ws.hosts)
    return Line("nodes", "PASS", states)


def _gres_counts(gres: str) -> dict[str, int]:
    """``gpu:2(S:0),shard:4`` -> {'gpu': 2, 'shard': 4}."""
    return {m[0]: int(m[1]) for m in re.findall(r"(gpu|shard)(?::[\w-]+)*:(\d+)", gres)}


def check_gres(ws: Workshop) -> Line:
    nodes = _records("node")
    wrong = []
    for h in ws.hosts:
        have = _gres_counts(nodes.get(h.name, {}).get("Gres", ""))
        want = {"gpu": h.gpus, **({"shard": h.gpus * ws.shards_per_gpu} if ws.shared else {})}
        if any(have.get(k, 0) != v for k, v in want.items()):
            wrong.append(f"{h.name} has {have or 'none'}, the file says {want}")
    if wrong:
        return Line("gres", "FAIL", "; ".join(wrong),
                    "make slurm.conf's Gres= and gres.conf match the workshop file (run "
                    "`course workshop` again and merge its files), then restart slurmd there")
    return Line("gres", "PASS", ", ".join(f"{h.name} gpu:{h.gpus}" for h in ws.hosts))


def check_partition(ws: Workshop) -> Line:
    parts = _records("partition")
    if ws.partition not in parts:
        return Line("partition", "FAIL", f"no partition {ws.partition!r} (Slurm has "
                    f"{sorted(parts)})", "add the PartitionName line of slurm-workshop.conf")
    listed = parts[ws.partition].get("Nodes", "")
    expanded = run_command(["scontrol", "show", "hostnames", listed], timeout=15).split()
    missing = [h.name for h in ws.hosts if h.name not in expanded]
    if missing:
        return Line("partition", "FAIL", f"{ws.partition} lacks {missing}",
                    f"list every host in PartitionName={ws.partition} Nodes=...")
    return Line("partition", "PASS", f"{ws.partition}: {listed}, "
                f"state {parts[ws.partition].get('State', '?')}")


def learner_step(ws: Workshop) -> list[str]:
    """The ``srun`` of one test learner's request: one task per GPU on every host."""
    cmd = ["srun", f"--partition={ws.partition}", f"--nodes={len(ws.hosts)}",
           f"--ntasks-per-node={ws.gpus_per_learner}", "--time=1",
           f"--immediate={STEP_TIMEOUT_S // 2}", "--job-name=course-workshop-check"]
    if ws.shared:
        cmd.append(f"--gres=shard:{ws.gpus_per_learner}")
    else:
        cmd.append("--gpus-per-task=1")
    if ws.reservation:
        cmd.append(f"--reservation={ws.reservation}")
    return cmd + ["sh", "-c", 'echo "rank-of $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}"']


def check_learner_ranks(ws: Workshop) -> Line:
    try:
        out = run_command(learner_step(ws), timeout=STEP_TIMEOUT_S)
    except SlurmError as exc:
        fix = ("set `partition` in the workshop file to one that `sinfo -s` lists"
               if "invalid partition" in exc.cause.lower() else exc.fix)
        return Line("a learner's ranks", "FAIL", _one_line(exc.cause), fix)
    seen: dict[str, list[str]] = defaultdict(list)
    for line in out.splitlines():
        if line.startswith("rank-of "):
            _, node, gpus = line.split(maxsplit=2)
            seen[node].append(gpus)
    where = ", ".join(f"{n}: GPUs {g}" for n, g in sorted(seen.items()))
    problems = [f"no rank on {h.name}" for h in ws.hosts
                if len(seen.get(h.name, [])) != ws.gpus_per_learner]
    for node, gpus in seen.items():
        if "none" in gpus:
            problems.append(f"a rank on {node} got no GPU")
        elif not ws.shared and len(set(gpus)) != len(gpus):
            problems.append(f"ranks on {node} share GPU(s) {gpus}")
    if problems:
        return Line("a learner's ranks", "FAIL", f"{'; '.join(problems)} ({where})",
                    "check GresTypes=gpu and the gres.conf File= lines on each host")
    return Line("a learner's ranks", "PASS", where)


#: What the first learner's step prints on each host, and leaves in their home there.
_USER_PROBE = ('echo "user-on $SLURMD_NODENAME $(id -u) $(id -g)"; '
               'touch "$HOME/.course-check-$SLURMD_NODENAME"')


def check_same_users(ws: Workshop) -> Line:
    """As the first learner, one task on every host: the learner has the same uid and gid
    there as here, and a file written in their home on each host is seen here (the homes are
    shared storage: labs run here, engines there)."""
    import pwd

    name, who = "same users, shared homes", ws.learners[0]
    try:
        entry = pwd.getpwnam(who)
    except KeyError:
        return Line(name, "FAIL", f"{who} is not a user of this host",
                    f"create the learners on every host with the same uid (useradd -u UID {who})")
    home = Path(entry.pw_dir)
    for h in ws.hosts:
        (home / f".course-check-{h.name}").unlink(missing_ok=True)
    step = [x for x in learner_step(ws)[:-3]  # one task per host, no GPU: who and where
            if not x.startswith(("--gpus-per-task", "--gres=", "--ntasks-per-node"))]
    step += ["--ntasks-per-node=1", "sh", "-c", _USER_PROBE]
    try:
        out = run_command(["runuser", "-u", who, "--", *step], timeout=STEP_TIMEOUT_S)
    except SlurmError as exc:
        return Line(name, "FAIL", _one_line(exc.cause), exc.fix)
    problems = []
    for line in out.splitlines():
        if line.startswith("user-on "):
            _, node, uid, gid = line.split()
            if (int(uid), int(gid)) != (entry.pw_uid, entry.pw_gid):
                problems.append(f"{who} is uid {uid} gid {gid} on {node}, "
                                f"{entry.pw_uid} {entry.pw_gid} here")
    unseen = [h.name for h in ws.hosts if not (home / f".course-check-{h.name}").exists()]
    if unseen:
        problems.append(f"the file {who} wrote in {home} on {unseen} is not seen here")
    for h in ws.hosts:
        (home / f".course-check-{h.name}").unlink(missing_ok=True)
    if problems:
        return Line(name, "FAIL", "; ".join(problems),
                    "give every learner the same uid and gid on every host (useradd -u/-g, or "
                    "LDAP), and their homes on storage every host mounts at the same path")
    return Line(name, "PASS", f"{who}: uid {entry.pw_uid} on {len(ws.hosts)} host(s), one "
                f"home seen from all")


def hub_call(url: str, token: str = "", method: str = "GET", body: dict | None = None,
             timeout: float = 5.0) -> tuple[int, dict]:
    """One JupyterHub REST call (also to a learner's lab through the hub): (HTTP status, the
    JSON answer or {}). Raises OSError when nothing answers in ``timeout`` s."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {**({"Authorization": f"token {token}"} if token else {}),
               **({"Content-Type": "application/json"} if data else {})}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.strip() else {}
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _hub(ws: Workshop, path: str, token: str = "", method: str = "GET",
         timeout: float = 5.0) -> tuple[int, dict]:
    return hub_call(ws.hub_url + "/hub/api" + path, token, method, timeout=timeout)


def check_hub(ws: Workshop) -> Line:
    try:
        code, body = _hub(ws, "")
    except OSError as exc:
        if isinstance(getattr(exc, "reason", exc), ssl.SSLCertVerificationError):
            return Line("hub", "FAIL", f"{ws.hub_url} answers with a certificate this host does "
                        f"not trust ({exc.reason.verify_message})",  # type: ignore[attr-defined]
                        f"use a certificate for {ws.hub.address} from a CA the learners' "
                        "browsers and this host trust (your own CA: add it to the system's, or "
                        "SSL_CERT_FILE=<ca.pem> for this check)")
        return Line("hub", "FAIL", f"{ws.hub_url} does not answer ({exc})",
                    f"start it on {ws.hub.name}: jupyterhub -f <out>/jupyterhub_config.py")
    if code != 200 or "version" not in body:
        return Line("hub", "FAIL", f"{ws.hub_url}/hub/api answered {code}",
                    "is this JupyterHub? check the hub's port in the workshop file")
    return Line("hub", "PASS", f"JupyterHub {body['version']} at {ws.hub_url}")


def check_spawn(ws: Workshop, token: str, user: str | None = None,
                timeout: float | None = None) -> Line:
    name = "a learner spawns"
    if not token:
        return Line(name, "SKIP", "no hub token: run `course workshop` first (it writes one), "
                    "or give --token")
    user = user or ws.learners[0]
    timeout = ws.lab_start_timeout + 30 if timeout is None else timeout
    t0 = time.monotonic()
    try:
        # The hub answers a start after up to its slow_spawn_timeout (10 s), then works on;
        # on a loaded host the answer can take longer: then look at the user model below.
        try:
            code, _ = _hub(ws, f"/users/{user}/server", token, "POST", timeout=60)
        except TimeoutError:
            code = 202
        if code not in (201, 202, 400):  # 400: already running
            return Line(name, "FAIL", f"the hub answered {code} to starting {user}'s lab",
                        "the token must be an admin's (jupyterhub token <admin>)")
        while time.monotonic() - t0 < timeout:
            _, model = _hub(ws, f"/users/{user}", token, timeout=30)
            if (model.get("servers", {}).get("", {}) or {}).get("ready"):
                _hub(ws, f"/users/{user}/server", token, "DELETE", timeout=30)
                return Line(name, "PASS", f"{user}'s lab was ready in {time.monotonic() - t0:.1f} s"
                            " (stopped again)")
            time.sleep(0.5)
    except OSError as exc:
        return Line(name, "FAIL", f"the hub stopped answering ({exc})", "read the hub's log")
    return Line(name, "FAIL", f"{user}'s lab was not ready within {timeout:.0f} s",
                "read the hub's log; is the learner an OS user of the hub host?")


CHECKS: tuple[Callable[[Workshop], Line], ...] = (
    check_slurm, check_nodes, check_gres, check_partition, check_learner_ranks,
    check_same_users, check_fencing, check_hub)
NAMES = {check_slurm: "slurm", check_nodes: "nodes", check_gres: "gres",
         check_partition: "partition", check_learner_ranks: "a learner's ranks",
         check_same_users: "same users, shared homes", check_fencing: "fencing and limits",
         check_hub: "hub"}


def _one_line(text: str) -> str:
    """A Slurm client's error in one line: its first line and, if more, its last."""
    lines = [line.strip() for line in text.strip().splitlines() if re.search(r"\w", line)]
    if not lines:
        return "no output"
    return lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"


def summary(lines: list[Line]) -> str:
    counts = {s: sum(1 for line in lines if line.status == s)
              for s in ("PASS", "WARN", "SKIP", "FAIL")}
    return (f"{counts['PASS']} passed, {counts['WARN']} warned, {counts['SKIP']} skipped, "
            f"{counts['FAIL']} failed (of {len(lines)} checks)")


def find_token(out: str | os.PathLike[str]) -> str:
    """The check service's token that ``course workshop`` wrote under ``out``, or ""."""
    try:
        return (Path(out) / CHECK_TOKEN_FILE).read_text().strip()
    except OSError:
        return ""


def run_checks(ws: Workshop, token: str | None = None, emit: Callable[[str], None] = print,
               learner_env: Path | None = None, course: Path | None = None) -> list[Line]:
    """Every check in order; Slurm's later checks are skipped when Slurm does not answer.
    ``token``: the hub API token that may start a learner's lab (default
    ``$JUPYTERHUB_API_TOKEN``); ``learner_env``: the learners' environment (for the sources
    check); ``course``: the course folder of ``course release`` (for its permissions)."""
    token = os.environ.get("JUPYTERHUB_API_TOKEN", "") if token is None else token
    lines: list[Line] = []
    with _slurm_conf(ws):
        for check in CHECKS:
            name = NAMES[check]
            if lines and lines[0].status == "FAIL" and check is not check_hub:
                line = Line(name, "SKIP", "Slurm does not answer")
            else:
                line = _guarded(name, check, ws)
            lines.append(line)
            emit(line.text())
            if check is check_learner_ranks:
                lines.append(_guarded("sources hidden", lambda w: check_sources(w, learner_env),
                                      ws))
                emit(lines[-1].text())
                lines.append(_guarded("course folder closed",
                                      lambda w: check_course_folder(w, learner_env, course), ws))
                emit(lines[-1].text())
                lines.append(_guarded("ports closed to others", lambda w: check_firewall(
                    w, learner_env.parent if learner_env else None), ws))
                emit(lines[-1].text())
    hub_ok = lines[-1].status == "PASS"
    lines.append(_guarded("TLS", check_tls, ws))
    emit(lines[-1].text())
    spawn = (_guarded("a learner spawns", lambda w: check_spawn(w, token), ws) if hub_ok
             else Line("a learner spawns", "SKIP", "the hub does not answer"))
    lines.append(spawn)
    emit(spawn.text())
    lines.append(_guarded("lab memory", check_lab_memory, ws))
    emit(lines[-1].text())
    lines.append(_guarded("grading sandbox", check_sandbox, ws))
    emit(lines[-1].text())
    return lines


@contextlib.contextmanager
def _slurm_conf(ws: Workshop) -> Iterator[None]:
    """Slurm's clients read the workshop file's ``slurm_conf`` while the checks run."""
    before = os.environ.get("SLURM_CONF")
    if ws.slurm_conf:
        os.environ["SLURM_CONF"] = ws.slurm_conf
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before


def _guarded(name: str, check: Callable[[Workshop], Line], ws: Workshop) -> Line:
    """One check's line, whatever goes wrong inside it: never a traceback."""
    try:
        return check(ws)
    except SlurmError as exc:
        return Line(name, "FAIL", _one_line(exc.cause), exc.fix)
    except Exception as exc:  # noqa: BLE001  # a check's own fault must not hide the others
        return Line(name, "FAIL", f"the check itself failed: {type(exc).__name__}: "
                    f"{_one_line(str(exc))}",
                    "run `course doctor`, then this check again with the cause fixed; if it "
                    "persists, report it with this line")
