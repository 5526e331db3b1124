"""The checks of ``course workshop check`` about what one learner can reach of another's or
the instructor's: files (run as a learner, ``runuser``, in the learners' environment) and
ports (the firewall that closes each learner's block of ports to the others)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ..cluster.kernel.exposure import listening_table
from .check_line import Line
from .learner_env import source_places
from .plan import Workshop

#: Seconds a probe run as the learner may take.
PROBE_TIMEOUT_S = 60

SOURCE_PROBE = """
import json, os, sys
from course_utils.assignments import lessons
read = []
for place in sys.argv[1:]:
    try:
        if os.path.isdir(place):
            os.listdir(place)
        else:
            open(place, "rb").close()
        read.append(place)
    except OSError:
        pass
print(json.dumps({"read": read, "env": str(lessons.NOTEBOOK_DIR),
                  "env_has": lessons.NOTEBOOK_DIR.exists()}))
"""


#: What of the course folder no learner may read (``course release`` closes them).
CLOSED_IN_COURSE = ("source", "gradebook.db", "submitted", "autograded", "feedback")


def _as_learner(ws: Workshop, name: str, learner_env: Path | None, places: list[str]
                ) -> tuple[dict | None, Line | None]:
    """What :data:`SOURCE_PROBE` sees of ``places`` as the first learner, or the line saying
    why it could not run."""
    python = learner_env / "bin" / "python" if learner_env else None
    if python is None or not python.exists():
        return None, Line(name, "SKIP", "no learners' environment: give --out (where `course "
                          "workshop` wrote learner-env/)")
    if os.geteuid() != 0:
        return None, Line(name, "SKIP", "run the check as root to try it as a learner")
    try:
        done = subprocess.run(["runuser", "-u", ws.learners[0], "--", str(python), "-c",
                               SOURCE_PROBE, *places], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, cwd="/", check=False)
        return json.loads(done.stdout.strip().splitlines()[-1]), None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return None, Line(name, "FAIL", f"the learners' Python did not run as "
                          f"{ws.learners[0]} ({exc})",
                          "run `course workshop` again; is the learner an OS user?")


def check_course_folder(ws: Workshop, learner_env: Path | None, course: Path | None) -> Line:
    """As a learner: the course folder's sources, gradebook, submissions and feedback cannot be
    read."""
    name = "course folder closed"
    if course is None:
        return Line(name, "SKIP", "no course folder given (--course)")
    if not (course / "nbgrader_config.py").exists():
        return Line(name, "FAIL", f"{course} is not a course folder (no nbgrader_config.py)",
                    "give --course, the folder of `course release` (run it first)")
    places = [str(course / p) for p in CLOSED_IN_COURSE if (course / p).exists()]
    seen, why = _as_learner(ws, name, learner_env, places)
    if why is not None:
        return why
    if seen["read"]:
        return Line(name, "FAIL", f"{ws.learners[0]} can read {', '.join(seen['read'])}",
                    f"chmod 711 {course} && chmod -R go-rwx " + " ".join(places)
                    + f" (learners only need to read {course}/release)")
    return Line(name, "PASS", f"{ws.learners[0]} cannot read {len(places)} of "
                f"{course.name}/{{{','.join(CLOSED_IN_COURSE)}}}")


def check_sources(ws: Workshop, learner_env: Path | None) -> Line:
    """As a learner (``runuser``), in the learners' environment: the instructor's source
    notebooks can be neither read nor found."""
    name = "sources hidden"
    places = [str(p) for p in source_places()]
    seen, why = _as_learner(ws, name, learner_env, places)
    if why is not None:
        return why
    if seen["read"]:
        return Line(name, "FAIL", f"{ws.learners[0]} can read {seen['read']}",
                    "close them to learners: chmod 700 the checkout's home (or "
                    f"chmod o-rwx {' '.join(seen['read'])})")
    if seen["env_has"]:
        return Line(name, "FAIL", f"the learners' environment has notebooks at {seen['env']}",
                    "run `course workshop` again: it rebuilds learner-env without them")
    return Line(name, "PASS", f"{ws.learners[0]} cannot read {len(places)} source folder(s); "
                "the learners' environment has none")


def check_firewall(ws: Workshop, out: Path | None) -> Line:
    """On this host: the table of ``firewall.nft`` is loaded and holds every learner's block.
    (Each host needs it; run the check on the hub host and load the same file on the others.)"""
    import shutil

    from .render import FIREWALL_TABLE

    name = "ports closed to others"
    fix = f"as root on every host: nft -f {out / 'firewall.nft' if out else '<out>/firewall.nft'}"
    if shutil.which("nft") is None:
        return Line(name, "FAIL", "nftables is not installed here",
                    "apt-get install -y nftables; then " + fix)
    if os.geteuid() != 0:
        return Line(name, "SKIP", "run the check as root to read the firewall")
    try:
        done = subprocess.run(["nft", "list", "table", "inet", FIREWALL_TABLE],
                              capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Line(name, "FAIL", f"nft did not answer ({exc})", fix)
    if done.returncode != 0:
        return Line(name, "FAIL", f"no table inet {FIREWALL_TABLE} on this host: any learner "
                    "can connect to another's torch store and TensorFlow servers", fix)
    missing = [who for who in ws.learners
               if "{}-{}".format(*ws.port_block(who)) not in done.stdout]
    if missing:
        return Line(name, "FAIL", f"the loaded table lacks the blocks of {missing} (an older "
                    "workshop file?)", "run `course workshop` again, then " + fix)
    squatters = block_squatters(ws, listening_table())
    if squatters:
        return Line(name, "FAIL", "; ".join(squatters) + ": the firewall refuses those ports to "
                    "everyone but that learner, so that service breaks for all others",
                    f"move it out of {_blocks_span(ws)} (the learners' blocks)")
    return Line(name, "PASS", f"{len(ws.learners)} learners' blocks from "
                f"{ws.port_block(ws.learners[0])[0]} closed to the others on this host")


def _blocks_span(ws: Workshop) -> str:
    return f"{ws.port_block(ws.learners[0])[0]}-{ws.port_block(ws.learners[-1])[1]}"


def block_squatters(ws: Workshop, listeners: list[tuple[str, int, int]]) -> list[str]:
    """Of ``listeners`` (:func:`~course_utils.cluster.kernel.exposure.listening_table`), those
    on a port of some learner's block whose owner is not that learner: a service the firewall
    would cut off (seen in the course's own test rig, a Slurm daemon on a port in a block)."""
    import pwd

    owners = {}
    for who in ws.learners:
        try:
            owners[who] = pwd.getpwnam(who).pw_uid
        except KeyError:
            owners[who] = -1
    found = []
    for _, port, uid in listeners:
        for who in ws.learners:
            low, high = ws.port_block(who)
            if low <= port <= high and uid != owners[who]:
                found.append(f"port {port} of {who}'s block is held by uid {uid}")
    return sorted(set(found))
