"""``course grade --sandbox`` for real: a submission that solves unit 0 and also tries to read
the gradebook, another learner's submission and the instructor's source, to write beside the
gradebook and to reach a port on this machine. Graded in bubblewrap's sandbox, every attempt
fails, nothing outside changes, the grade records what was tried, and the notebook's own
cluster (started inside) still earns full marks."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import threading

import nbformat
import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR
from course_utils.assignments.release import read_nb, release
from course_utils.instructor import sandbox
from course_utils.instructor.autograde import grade
from course_utils.notebook_cells import nbgrader_meta
from tests.rigs.common import require_bwrap
from tests.submissions import PROBE_PREAMBLE, probe_verdicts, solved

UNIT0 = "00_cluster_tour.ipynb"
pytestmark = pytest.mark.timeout(900)

#: The cell the hostile learner adds after the set-up cell: each attempt prints one line.
PROBES = PROBE_PREAMBLE + r'''
_try("read gradebook", lambda: open(os.path.join(root, "gradebook.db"), "rb").read(16))
_try("list submissions", lambda: os.listdir(os.path.join(root, "submitted")) or 1 / 0)
_try("read eve", lambda: open(os.path.join(root, "submitted/eve/unit0/UNIT0")).read(16))
_try("write beside gradebook", lambda: open(os.path.join(root, "pwned.txt"), "w").write("x"))
_try("read source", lambda: open("SOURCE").read(16))
_try("connect out", lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3))
_try("whoami", lambda: os.getuid() == 65534 or 1 / 0)
'''


def test_sandboxed_grading_denies_every_attempt_and_still_grades(tmp_path):
    require_bwrap()
    course = release(tmp_path / "course", units=[0])
    u = course.units[0]
    full = solved(read_nb(u.release), read_nb(u.source))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    reached: list[object] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                reached.append(listener.accept()[1])
            except OSError:
                continue

    threading.Thread(target=watch, daemon=True).start()
    hostile = copy.deepcopy(full)
    at = next(i for i, c in enumerate(hostile.cells) if nbgrader_meta(c).get("grade_id") == "setup")
    probes = (PROBES.replace("UNIT0", UNIT0).replace("SOURCE", str(NOTEBOOK_DIR / UNIT0))
              .replace("PORT", str(listener.getsockname()[1])))
    hostile.cells.insert(at + 1, nbformat.v4.new_code_cell(probes))
    # eve handed in earlier (her notebook is in the course folder); mallory is graded now
    for folder, nb in ((course.root / "submitted" / "eve" / "unit0", full),
                       (tmp_path / "class" / "mallory", hostile)):
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / UNIT0))
    gradebook = (course.root / "gradebook.db").read_bytes()
    try:
        res = grade(tmp_path / "class", course=course.root, sandbox=True, cell_timeout=120)
    finally:
        done.set()
    print(res.table())
    got = {g.student: g for g in res.notebooks}
    assert list(got) == ["mallory"]  # the notebook's own cluster ran inside the sandbox:
    assert got["mallory"].score == got["mallory"].max_score == 6, got["mallory"]
    ran = read_nb(course.root / "autograded" / "mallory" / "unit0" / UNIT0)
    verdict = probe_verdicts(ran)
    print(verdict)
    assert verdict == {"read gradebook": "DENIED", "list submissions": "DENIED",
                       "read eve": "DENIED", "write beside gradebook": "DENIED",
                       "read source": "DENIED", "connect out": "DENIED",
                       "whoami": "ALLOWED"}, verdict
    assert not (course.root / "pwned.txt").exists() and not reached
    # ... and the grader recorded what was tried (the audit hook of sandbox_kernel)
    note = "; ".join(got["mallory"].notes)
    print(note)
    assert note.startswith("tried what the sandbox denies: ")
    for target in ("gradebook.db", "submitted", "pwned.txt"):
        assert target in note, note
    assert (course.root / "gradebook.db").read_bytes() != b""  # written by the grader only
    assert gradebook[:16] == (course.root / "gradebook.db").read_bytes()[:16]


def test_sandbox_argv_hides_then_binds_and_drops_the_environment(tmp_path, monkeypatch):
    if shutil.which("bwrap") is None:
        monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setenv("COURSE_ENGINES", "2")
    monkeypatch.setenv("JPY_API_TOKEN", "secret")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "hidden" / "inner").mkdir()
    argv = sandbox.sandbox_argv([str(tmp_path / "hidden" / "inner"), str(tmp_path / "hidden"),
                                 str(tmp_path / "file")],
                                [str(tmp_path / "hidden" / "work")], [str(tmp_path)],
                                sandbox.kept_env(), str(tmp_path / "hidden" / "work"))
    text = " ".join(argv)
    assert "--unshare-all" in argv and "--clearenv" in argv and argv[-1] == "--"
    assert text.index(f"--tmpfs {tmp_path / 'hidden'}") < text.index(
        f"--bind {tmp_path / 'hidden' / 'work'}")
    assert f"--ro-bind /dev/null {tmp_path / 'file'}" in text
    assert text.index(f"--bind {tmp_path / 'hidden' / 'work'}") < text.index(
        f"--remount-ro {tmp_path / 'hidden'}")
    assert "COURSE_ENGINES 2" in text and "secret" not in text
    assert "inner" not in text  # inside a hidden folder: hidden with it
    homes = sandbox.people_homes()  # a workshop's learners live there
    assert ("/home" in homes) == os.path.isdir("/home") and "/" not in homes


def test_the_audit_hook_reports_hidden_paths_only(tmp_path):
    """What the sandbox binds back in (Python, the package, the graded folder) is not an
    attempt: without that, a plain notebook was noted for 150 reads of Python's own files."""
    import os

    from course_utils.instructor.sandbox_kernel import MARK, make_hook

    read_end, write_end = os.pipe()
    hook = make_hook(["/course", "/home/teacher"], ["/home/teacher/venv", "/course/autograded/a"],
                     write_end)
    for event, args in (("open", ("/home/teacher/venv/lib/x.py", "r", 0)),
                        ("open", ("/course/autograded/a/unit0/n.ipynb", "r", 0)),
                        ("open", ("/elsewhere/file", "r", 0)),
                        ("socket.connect", (None, ("127.0.0.1", 80))),
                        ("os.listdir", ("/course/submitted",)),
                        ("open", ("/home/teacher/.ssh/id_rsa", "r", 0)),
                        ("socket.connect", (None, ("10.0.0.7", 443)))):
        hook(event, args)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        lines = [json.loads(ln[len(MARK):]) for ln in f.read().splitlines()]
    assert lines == [{"what": "list", "target": "/course/submitted"},
                     {"what": "open", "target": "/home/teacher/.ssh/id_rsa"},
                     {"what": "connect", "target": "10.0.0.7:443"}]
    assert sandbox.describe(lines, limit=2) == (
        "tried what the sandbox denies: list /course/submitted, open /home/teacher/.ssh/id_rsa "
        "and 1 more")
