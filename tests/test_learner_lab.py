"""What ``course lab`` sets up for a learner, without a browser: the working folder and its
rules, the course home, the named kernel, ``course solution``, the ``%%px`` output helper and the
IPython Parallel panel guard. The browser checks are in ``tests/test_lab_browser.py``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from course_utils import cli, notebook_cells
from course_utils.assignments import lessons, syllabus
from course_utils.cluster.kernel import pxoutput
from course_utils.cluster.ranks import RankInfo, RankMap
from course_utils.errors import CourseError
from course_utils.learner import home, kernelspec, lab, labconfig, labpanel, workspace

UNIT0 = lessons.NOTEBOOK_DIR / "00_cluster_tour.ipynb"
UNIT3 = lessons.NOTEBOOK_DIR / "03_pytorch_ddp.ipynb"


def rank_map(engine_ids: list[int]) -> RankMap:
    return RankMap(tuple(
        RankInfo(engine_id=e, rank=r, world_size=len(engine_ids), local_rank=r,
                 local_world_size=len(engine_ids), node_rank=0, host="vm", addr="127.0.0.1",
                 pid=100 + r, gpus=0, master_addr="127.0.0.1")
        for r, e in enumerate(engine_ids)))


@pytest.fixture
def sources(tmp_path) -> list[Path]:
    """Copies of two real units the tests may change, as the course's source folder."""
    folder = tmp_path / "source"
    folder.mkdir()
    for src in (UNIT0, UNIT3):
        shutil.copy(src, folder / src.name)
    return sorted(folder.glob("*.ipynb"))


def edit_source(path: Path, text: str) -> None:
    nb = lessons.read(path)
    nb.cells.append(nbformat.v4.new_markdown_cell(text))
    nbformat.write(nb, str(path))


# --------------------------------------------------------------------------- %%px output


def test_collapse_cr_is_what_a_terminal_shows():
    bar = "".join(f"\repoch 0: {p:3d}%|{'#' * (p // 10):<10}|" for p in range(0, 101, 10))
    assert pxoutput.collapse_cr(bar + "\nepoch 0: done\n") == \
        "epoch 0: 100%|##########|\nepoch 0: done\n"
    assert pxoutput.collapse_cr("abc\rX") == "Xbc"
    assert pxoutput.collapse_cr("abc\r") == "abc"
    assert pxoutput.collapse_cr("a\r\nb") == "a\nb"
    assert pxoutput.collapse_cr("no returns\n") == "no returns\n"


def test_labels_name_the_rank_of_each_engine(monkeypatch):
    from course_utils.cluster.kernel import registry

    assert pxoutput.rank_label("stdout", 3, None) == "[stdout:3]"
    monkeypatch.setattr(registry, "_current", SimpleNamespace(rank_map=rank_map([3, 2])))
    assert pxoutput.rank_of_engine(2) == 1 and pxoutput.rank_of_engine(9) is None
    assert pxoutput.relabel("[stdout:2] hello\n") == "[rank 1, engine 2] hello\n"
    assert pxoutput.relabel("[stderr:3] w\rwarn") == "[rank 0, engine 3, stderr] warn"
    assert pxoutput.relabel("[output:3]") == "[rank 0, engine 3, output]"
    assert pxoutput.relabel("[stdout:9] x") == "[stdout:9] x"  # not in the rank map
    assert pxoutput.relabel("plain\rtext") == "textn"  # a terminal's overwrite
    monkeypatch.setattr(registry, "_current", None)
    assert pxoutput.relabel("[stdout:2] hi") == "[stdout:2] hi"


def test_install_wraps_ipyparallels_display_once():
    code = textwrap.dedent("""
        from ipyparallel.client import asyncresult as ar
        seen = []
        ar.publish_display_data = lambda data, *a, **k: seen.append(data["text/plain"])
        ar._raw_text = lambda s: seen.append(s)
        from course_utils.cluster.kernel import pxoutput, registry
        from types import SimpleNamespace
        ranks = {5: SimpleNamespace(rank=0), 4: SimpleNamespace(rank=1)}
        by_engine = SimpleNamespace(by_engine=ranks.__getitem__)
        registry.make_current(SimpleNamespace(rank_map=by_engine))
        assert pxoutput.install() and pxoutput.install()
        wrapped = ar.publish_display_data
        assert pxoutput.install() and ar.publish_display_data is wrapped   # idempotent
        ar.publish_display_data({"text/plain": "[stdout:4] 0%\\r50%\\r100%"}, update=True)
        ar._raw_text("[output:5]")
        print(seen)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['[rank 1, engine 4] 100%', '[rank 0, engine 5, output]']"


def test_replayed_output_keeps_one_display_per_engine():
    """Output sent before a cell's stream began is replayed without a parent header; ipyparallel
    then gave every engine the display id "-stdout", so rank 1's line replaced rank 0's."""
    code = textwrap.dedent("""
        from types import SimpleNamespace
        from ipyparallel.client import asyncresult as ar
        shown = {}
        def publish(data, transient=None, update=False, **k):
            did = transient["display_id"]
            assert update == (did in shown), (did, update)
            shown[did] = data["text/plain"]
        ar.publish_display_data = publish
        ar.get_ipython = lambda: SimpleNamespace(kernel=object())
        from course_utils.cluster.kernel import pxoutput
        assert pxoutput.install()
        result = SimpleNamespace(_already_streamed={})
        cb = ar.AsyncResult._iopub_streaming_output_callback
        for eid in (0, 1):   # the replay stream_output() makes of output already in
            md = {"stdout": f"rank {eid} of 2\\n"}
            future = SimpleNamespace(msg_id=f"req-{eid}", output=SimpleNamespace(metadata=md))
            cb(result, eid, future, {"header": {"msg_type": "stream"},
                                     "content": {"name": "stdout", "text": md["stdout"]}})
        md["stdout"] += "later\\n"   # engine 1's next line, as the engine sends it
        cb(result, 1, future, {"header": {"msg_type": "stream"}, "parent_header":
                               {"msg_id": "req-1"}, "content": {"name": "stdout", "text": "later"}})
        print(sorted(shown.items()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("[('req-0-stdout', '[stdout:0] rank 0 of 2\\n'), "
                                  "('req-1-stdout', '[stdout:1] rank 1 of 2\\nlater\\n')]")


# --------------------------------------------------------------------------- kernel


@pytest.fixture
def kernel_prefix(tmp_path, monkeypatch) -> Path:
    prefix = tmp_path / "prefix"
    monkeypatch.setenv(kernelspec.ENV_KERNEL_PREFIX, str(prefix))
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    return prefix


def test_kernelspec_installs_once_and_points_at_this_python(kernel_prefix):
    path, written = kernelspec.install()
    assert written and path == kernelspec.kernel_dir(kernel_prefix)
    spec = json.loads((path / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and spec["display_name"] == kernelspec.DISPLAY_NAME
    assert "--IPKernelApp.extra_extensions=course_utils.cluster.kernel.pxoutput" in spec["argv"]
    assert (path / "logo-64x64.png").exists()
    assert kernelspec.install() == (path, False)  # idempotent
    spec["argv"][0] = "/elsewhere/python"
    (path / "kernel.json").write_text(json.dumps(spec))
    assert kernelspec.install() == (path, True)  # repaired
    found = kernelspec.find_spec()
    assert found and Path(found[0]) == path


def test_the_course_kernel_starts_with_the_course_loaded(kernel_prefix):
    from jupyter_client.manager import start_new_kernel

    kernelspec.install()
    km, kc = start_new_kernel(kernel_name=kernelspec.KERNEL_NAME, startup_timeout=60)
    try:
        code = ("import sys, course_utils; print(sys.executable, "
                "'course_utils.cluster.kernel.pxoutput' in get_ipython().extension_manager.loaded)")
        out = []
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(
            m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
        assert reply["content"]["status"] == "ok"
        assert "".join(out).split() == [sys.executable, "True"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_doctor_checks_the_kernel(kernel_prefix, monkeypatch):
    find = kernelspec.find_spec  # only the test's prefix: the session installed one in sys.prefix
    monkeypatch.setattr(kernelspec, "find_spec", lambda: find(
        [str(kernel_prefix / "share" / "jupyter" / "kernels")]))
    check = kernelspec.kernel_health()
    assert not check.ok and kernelspec.KERNEL_NAME in check.detail and "course kernel" in check.fix
    kernelspec.install()
    check = kernelspec.kernel_health()
    assert check.ok and sys.executable in check.detail, check
    spec = kernelspec.kernel_dir() / "kernel.json"
    broken = json.loads(spec.read_text())
    broken["argv"][0] = "/no/such/python"
    spec.write_text(json.dumps(broken))
    check = kernelspec.kernel_health()
    assert not check.ok and "does not exist" in check.detail
    # course doctor runs it with its other checks
    from course_utils.instructor import doctor

    monkeypatch.setattr(doctor, "version_check", lambda m, label, v=(): doctor.Check(label, True,
                                                                                      "x"))
    monkeypatch.setattr(doctor, "check_cluster", lambda *a, **k: [])
    names = [c.name for c in doctor.run_checks(tf=False, emit=lambda line: None)]
    assert "kernel" in names


def test_set_kernelspec():
    nb = lessons.read(UNIT0)
    assert kernelspec.set_kernelspec(nb) is nb
    assert nb.metadata.kernelspec == {"name": "dist-training-course", "language": "python",
                                      "display_name": "Distributed training course"}


# --------------------------------------------------------------------------- working folder


@pytest.fixture(autouse=True, scope="module")
def release_cache(tmp_path_factory):
    """One cache of released student notebooks for this module (not the user's ~/.cache)."""
    from course_utils.assignments import release

    mp = pytest.MonkeyPatch()
    mp.setenv(release.ENV_CACHE, str(tmp_path_factory.mktemp("release-cache")))
    yield
    mp.undo()


def test_learner_version_has_stubs_no_hidden_tests_and_the_course_kernel():
    source = lessons.read(UNIT3)
    mine = workspace.learner_version(UNIT3)
    assert len(mine.cells) == len(source.cells)
    text = nbformat.writes(mine)
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert "the same epoch must give the same order" not in text  # a hidden assert
    for cell in mine.cells:
        if notebook_cells.is_solution_cell(cell) and cell.cell_type == "code":
            assert re.search(r"raise NotImplementedError\(['\"].+: replace this line", cell.source)
        if notebook_cells.is_test_cell(cell):
            assert cell.metadata.get("editable") is False  # locked, as nbgrader releases them
            assert notebook_cells.nbgrader_meta(cell).get("checksum")
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert mine.metadata.kernelspec.name == kernelspec.KERNEL_NAME
    assert lessons.read(UNIT3) == source  # source untouched


def test_the_learners_copy_is_the_student_notebook_a_release_hands_out(tmp_path, sources):
    """``course lab``'s copy of a unit = ``course release``'s student notebook: the same cells,
    stub hints and nbgrader metadata with checksums; only the kernel differs (the course's)."""
    from course_utils.assignments.release import read_nb, release, student_notebook

    unit0 = sources[0]
    released = read_nb(release(tmp_path / "course", units=[0],
                               notebook_dir=unit0.parent).units[0].release)
    workspace.sync(tmp_path / "work", [unit0])
    mine = lessons.read(tmp_path / "work" / unit0.name)
    assert mine.cells == released.cells
    assert {k: v for k, v in mine.metadata.items() if k != "kernelspec"} == {
        k: v for k, v in released.metadata.items() if k != "kernelspec"}
    assert mine.metadata.kernelspec.name == kernelspec.KERNEL_NAME
    locked = [c for c in mine.cells if notebook_cells.nbgrader_meta(c).get("locked")]
    assert locked and all(notebook_cells.nbgrader_meta(c).get("checksum") for c in locked)
    stubs = [c.source for c in mine.cells if notebook_cells.is_solution_cell(c)]
    assert stubs and all(re.search(r"raise NotImplementedError\(['\"]", s) for s in stubs), stubs
    assert any("Exercise 1" in s for s in stubs)
    # Cached: a second copy is read, not released again; a changed source is released anew.
    cached = sorted((Path(os.environ["COURSE_CACHE_DIR"]) / "student").glob("00_*.ipynb"))
    assert len(cached) == 1 and student_notebook(unit0) == read_nb(cached[0])
    edit_source(unit0, "A new paragraph.")
    assert "A new paragraph." in nbformat.writes(student_notebook(unit0))
    assert len(list((Path(os.environ["COURSE_CACHE_DIR"]) / "student").glob("00_*"))) == 1


def test_sync_adds_keeps_replaces_offers_and_restores(tmp_path, sources):
    wd = tmp_path / "work"
    unit0, unit3 = (s.name for s in sources)
    first = workspace.sync(wd, sources)
    assert first.added == [unit0, unit3] and not first.lines()[0].startswith("6 units")
    assert workspace.sync(wd, sources).unchanged == [unit0, unit3]
    # A change in a solution or a hidden test does not change what the learner gets.
    src3 = sources[1]
    nb3 = lessons.read(src3)
    sol = notebook_cells.find_cell(nb3.cells, "ex1-solution")
    assert "drop_last=True" in sol.source  # inside ex1's solution region
    sol.source = sol.source.replace("drop_last=True", "drop_last = True")
    nbformat.write(nb3, str(src3))
    assert workspace.sync(wd, sources).unchanged == [unit0, unit3]
    # The course changed unit 0; the learner never saved it: replaced.
    edit_source(sources[0], "A new paragraph.")
    assert workspace.sync(wd, sources).replaced == [unit0]
    assert "A new paragraph." in (wd / unit0).read_text()
    # The learner saved unit 0, then the course changed it again: offered beside, copy kept.
    mine = lessons.read(wd / unit0)
    mine.cells[0].source += "\n\nmy note"
    nbformat.write(mine, str(wd / unit0))
    kept = (wd / unit0).read_bytes()
    edit_source(sources[0], "Second change.")
    result = workspace.sync(wd, sources)
    offered = unit0.replace(".ipynb", ".updated.ipynb")
    assert result.offered == [(unit0, offered)] and (wd / unit0).read_bytes() == kept
    assert "Second change." in (wd / offered).read_text()
    assert any("your copy is kept" in line for line in result.lines())
    assert workspace.sync(wd, sources).unchanged == [unit0, unit3]  # offered once
    # A third change: the untouched offer is refreshed in place; an edited one is kept.
    edit_source(sources[0], "Third change.")
    assert workspace.sync(wd, sources).offered == [(unit0, offered)]
    (wd / offered).write_text((wd / offered).read_text().replace("Third", "My third"))
    edit_source(sources[0], "Fourth change.")
    newer = unit0.replace(".ipynb", ".updated-2.ipynb")
    assert workspace.sync(wd, sources).offered == [(unit0, newer)]
    assert "My third" in (wd / offered).read_text() and (wd / unit0).read_bytes() == kept
    # Deleted copies come back fresh; the offered versions are not units.
    (wd / unit3).unlink()
    assert workspace.sync(wd, sources).restored == [unit3]
    assert [p.name for p in workspace.unit_copies(wd)] == [unit0, unit3]


def test_sync_adopts_files_it_did_not_write(tmp_path, sources):
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / sources[0].name).write_text(nbformat.writes(nbformat.v4.new_notebook()))
    result = workspace.sync(wd, sources)
    assert result.added == [sources[1].name]
    assert result.offered == [(sources[0].name, sources[0].name.replace(".ipynb",
                                                                        ".updated.ipynb"))]
    edit_source(sources[0], "changed")  # never replaced: we did not write it
    assert workspace.sync(wd, sources).offered
    assert lessons.read(wd / sources[0].name).cells == []


def test_a_broken_manifest_is_a_clear_error(tmp_path, sources):
    wd = tmp_path / "work"
    workspace.sync(wd, sources)
    (wd / workspace.MANIFEST).write_text("{not json")
    with pytest.raises(workspace.WorkspaceError, match="Fix: delete"):
        workspace.sync(wd, sources)


def test_default_workdir(monkeypatch, tmp_path):
    monkeypatch.setenv(workspace.ENV_WORKDIR, str(tmp_path / "w"))
    assert workspace.default_workdir() == tmp_path / "w"
    monkeypatch.delenv(workspace.ENV_WORKDIR)
    assert workspace.default_workdir() == Path.home() / "dist-training-course"


def test_units_exercises_and_test_states(tmp_path, sources):
    wd = tmp_path / "work"
    workspace.sync(wd, sources)
    assert workspace.find_unit(wd, "3").name == sources[1].name
    assert workspace.find_unit(wd, "00") == workspace.find_unit(wd, "00_cluster_tour")
    with pytest.raises(workspace.WorkspaceError, match="units: 00_cluster_tour"):
        workspace.find_unit(wd, "7")
    nb = lessons.read(wd / sources[1].name)
    found = workspace.exercises(nb)
    assert sorted(found) == ["ex1", "ex2", "ex3", "ex4", "predict"]
    assert all(v["tests"] for v in found.values())
    ex2_test = nb.cells[found["ex2"]["tests"][0]]
    assert workspace.exercise_named(nb, "ex2") == "ex2"
    assert workspace.exercise_named(nb, ex2_test.metadata.nbgrader.grade_id) == "ex2"
    status = workspace.unit_status(wd / sources[1].name)
    assert status.summary() == "not run yet" and len(status.tests) == 5
    t1, t2, t3, t4, t5 = (nb.cells[found[e]["tests"][0]]
                          for e in ("ex1", "ex2", "ex3", "predict", "ex4"))
    t1.execution_count = 4
    t2.execution_count = 5
    t2.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="no",
                                         traceback=[])]
    assert [workspace.test_state(c) for c in (t1, t2, t3)] == ["passed", "failed", "not run"]
    assert workspace.attempted(t2) and not workspace.attempted(t3)
    nbformat.write(nb, str(wd / sources[1].name))
    assert workspace.unit_status(wd / sources[1].name).summary() == \
        "1 of 5 visible tests pass; failing: ex2-test"
    t2.outputs, t3.execution_count, t4.execution_count, t5.execution_count = [], 6, 7, 8
    nbformat.write(nb, str(wd / sources[1].name))
    assert workspace.unit_status(wd / sources[1].name).summary() == \
        "passes its visible tests (5 of 5)"


def test_solution_only_after_the_visible_test_ran(tmp_path, sources):
    wd = tmp_path / "work"
    workspace.sync(wd, sources)
    with pytest.raises(workspace.WorkspaceError, match="has not been run") as caught:
        workspace.reveal_solution(wd, "3", "ex2", source_dir=sources[0].parent)
    assert "Ctrl-S" in str(caught.value)
    with pytest.raises(workspace.WorkspaceError, match=r"no exercise 'ex9' \(exercises: ex1"):
        workspace.reveal_solution(wd, "3", "ex9", source_dir=sources[0].parent)
    nb = lessons.read(wd / sources[1].name)
    test = nb.cells[workspace.exercises(nb)["ex2"]["tests"][0]]
    test.outputs = [nbformat.v4.new_output("error", ename="NotImplementedError", evalue="",
                                           traceback=[])]
    nbformat.write(nb, str(wd / sources[1].name))
    text = workspace.reveal_solution(wd, "3", "ex2-test", source_dir=sources[0].parent)
    assert text.startswith("# ex2-solution\nmodel = model.to(device)")
    assert "DistributedSampler" not in text  # that is ex1's
    assert workspace.load_manifest(wd)["solutions_shown"] == {sources[1].name: ["ex2"]}
    # A copy saved before cells named their exercise (metadata.course): paired from the source.
    for cell in nb.cells:
        cell.metadata.pop("course", None)
    nbformat.write(nb, str(wd / sources[1].name))
    assert workspace.reveal_solution(wd, "3", "ex2", source_dir=sources[0].parent) == text
    # A workshop's learners' environment carries no source: a clear answer, not a traceback.
    with pytest.raises(workspace.WorkspaceError, match="carries no solutions") as caught:
        workspace.reveal_solution(wd, "3", "ex2", source_dir=tmp_path / "no-source")
    assert "ask them" in caught.value.fix


# --------------------------------------------------------------------------- course home


def test_every_unit_states_its_time_and_objectives():
    infos = home.units()
    assert [i.file for i in infos] == [p.name for p in lessons.source_notebooks()]
    for info in infos:
        assert info.number >= 0 and info.title.startswith(f"Unit {info.number}"), info
        assert info.minutes and 10 <= info.minutes <= 300, info
        assert len(info.objectives) >= 3 and all(len(o) > 20 for o in info.objectives), info
        # the time the unit's own header states is the syllabus's
        intro = next(c.source for c in lessons.read(lessons.NOTEBOOK_DIR / info.file).cells
                     if c.cell_type == "markdown")
        assert syllabus.header_time(intro) == info.time == syllabus.unit(
            info.number).time_text(), (info.file, syllabus.header_time(intro))
    unit0 = infos[0]
    assert unit0.minutes == 90 and infos[1].minutes == 240 and infos[3].minutes == 120
    assert infos[4].route == "TensorFlow" and infos[9].route == "PyTorch + TensorFlow"


NEXT = re.compile(r"\*\*Next:\*\*(.+)", re.S)


@pytest.mark.parametrize("path", lessons.source_notebooks()[:-1], ids=lambda p: p.name)
def test_every_unit_but_the_last_ends_by_naming_the_next_one_of_its_route(path):
    """The summary's last line says where to go next, by the routes of the syllabus."""
    number = int(path.name[:2])
    last = [c.source for c in lessons.read(path).cells if c.cell_type == "markdown"][-1]
    found = NEXT.search(last)
    assert found, f"{path.name}: its last markdown cell has no **Next:** line"
    named = {int(n) for n in re.findall(r"\bUnit (\d+)", found.group(1))}
    later = {u.number for u in syllabus.UNITS if u.number > number}
    assert named and named <= later, (path.name, named)
    routes = syllabus.unit(number).routes
    follows = {r: min((u.number for u in syllabus.UNITS if u.number > number and r in u.routes),
                      default=None) for r in routes}
    assert {n for n in follows.values() if n is not None} <= named, (path.name, follows, named)


def test_the_readme_table_and_routes_are_the_syllabus():
    readme = Path(__file__).parents[1] / "README.md"
    text = readme.read_text()
    start = text.index(syllabus.README_START)
    end = text.index(syllabus.README_END) + len(syllabus.README_END)
    block = text[start:end]
    assert block == syllabus.readme_block(syllabus.readme_descriptions(block)), (
        "README's units table is out of date: python -m course_utils.assignments.syllabus")
    assert "units 0-3, 6-8, 9 (part A), 10-11" in block and "units 4-5, 9 (part B)" in block
    assert syllabus.route_minutes(syllabus.PYTORCH) == (1545, 1695)
    assert syllabus.span((90, 90)) == "90 min" and syllabus.span((210, 240)) == "3.5-4 h"


def test_set_unit_metadata_round_trips():
    nb = lessons.read(UNIT3)
    parsed = home.unit_info(nb, UNIT3.name)
    home.set_unit_metadata(nb, UNIT3.name)
    assert nb.metadata.course["minutes"] == 120 and nb.metadata.course["objectives"]
    nb.cells[0].source = "# something else"  # now the fields, not the prose, are read
    assert home.unit_info(nb, UNIT3.name) == parsed


def test_marking_the_sources_changes_only_their_metadata(tmp_path):
    """What the lead applies to notebooks/ (lab.mark_source_notebook); nbval still runs them."""
    for path in lessons.source_notebooks():
        nb = lessons.read(path)
        before = [dict(c) for c in nb.cells]
        lab.mark_source_notebook(nb, path.name)
        assert [dict(c) for c in nb.cells] == before
        assert nb.metadata.kernelspec.name == kernelspec.KERNEL_NAME
        assert home.unit_info(nb, path.name) == home.unit_info(lessons.read(path), path.name)
    tiny = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import course_utils")])
    kernelspec.set_kernelspec(tiny)
    tiny.metadata.kernelspec.name = "a-kernel-nobody-installed"  # nbval must not need it
    nbformat.write(tiny, str(tmp_path / "tiny.ipynb"))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", str(tmp_path / "tiny.ipynb"),
                          "-p", "no:cacheprovider", "--rootdir", str(Path(__file__).parents[1]),
                          "-c", str(Path(__file__).parents[1] / "pyproject.toml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:]


def test_home_matches_the_notebooks(tmp_path):
    wd = tmp_path / "work"
    workspace.sync(wd)
    facts = {"cluster_id": "course", "profile": "local", "ipython_profile": "course",
             "running": True, "ranks": [{"rank": r, "engine_id": r, "host": "vm", "local_rank": r,
                                         "gpus": 0} for r in range(2)]}
    nb = home.home_notebook(wd, facts=facts)
    text = "\n".join(c.source for c in nb.cells)
    for info in home.units():
        assert f"[{info.title}]({info.file})" in text and info.shown_time in text
        for objective in info.objectives:
            assert objective in text
        assert (wd / info.file).exists()
    assert "**2 ranks** on 1 host (vm)" in text and "| 1 | vm | 1 | 0 |" in text
    assert syllabus.routes_text() in text
    assert text.count("not run yet") == len(home.units())
    assert nb.metadata.kernelspec.name == kernelspec.KERNEL_NAME
    assert nb.cells[-1].source.endswith("home.show()")


def test_write_home_reads_the_recorded_cluster_and_status(tmp_path, sources):
    wd = tmp_path / "work"
    workspace.sync(wd, sources)
    cc = SimpleNamespace(cluster_id="pytest-x", profile=SimpleNamespace(name="local"),
                         ranks=rank_map([0, 1]))
    home.write_cluster_facts(wd, cc)
    facts = home.read_cluster_facts(wd)
    assert facts["lab_pid"] == os.getpid() and facts["running"] is False  # no cluster file
    assert "**not running**" in home.cluster_markdown(facts)
    assert "No cluster recorded" in home.cluster_markdown(None)
    path = home.write_home(wd, sources)
    text = "\n".join(c.source for c in lessons.read(path).cells)
    assert "cluster id `pytest-x`" in text and text.count("not run yet") == 2
    manifest = workspace.load_manifest(wd)
    manifest["solutions_shown"][sources[0].name] = ["ex1"]
    workspace.save_manifest(wd, manifest)
    assert "solution shown for ex1" in home.status_markdown(wd, home.units(sources))


def test_show_displays_the_current_status(tmp_path, sources, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    workspace.sync(tmp_path, sources)
    home.show(tmp_path)
    assert "### Units" in shown[0] and "Unit 0: Cluster tour" in shown[0]


# --------------------------------------------------------------------------- commands


def test_course_home_solution_and_kernel_commands(tmp_path, sources, kernel_prefix, capsys,
                                                  monkeypatch):
    wd = tmp_path / "work"
    assert cli.main(["home", "--workdir", str(wd)]) == 1
    workspace.sync(wd)
    assert cli.main(["home", "--workdir", str(wd)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {wd / home.HOME_NAME}" in out and "unit 3: Unit 3: PyTorch DDP (2 h)" in out
    assert cli.main(["solution", "0", "ex1", "--workdir", str(wd)]) == 1
    assert "has not been run" in capsys.readouterr().err
    assert cli.main(["kernel"]) == 0
    assert f"installed: 'Distributed training course' (dist-training-course) in " \
           f"{kernelspec.kernel_dir()}" in capsys.readouterr().out


def test_prepare_serves_the_learners_folder_or_the_source(tmp_path, kernel_prefix):
    lines: list[str] = []
    plan = lab.prepare(str(tmp_path / "w"), False, lessons.NOTEBOOK_DIR, emit=lines.append)
    assert plan.root == tmp_path / "w" and not plan.source
    assert f"--LabApp.default_url=/lab/tree/{home.HOME_NAME}" in plan.jupyter_args
    assert labpanel.jupyter_args()[0] in plan.jupyter_args
    assert any("installed in" in ln for ln in lines) and any("added 00_" in ln for ln in lines)
    notes = {p.name for p in (lessons.NOTEBOOK_DIR / "instructor_notes").glob("*.md")}
    copied = {p.name for p in (tmp_path / "w").rglob("*")}
    assert notes and not notes & copied and "instructor_notes" not in copied  # not the learner's
    src = lab.prepare(None, True, lessons.NOTEBOOK_DIR, emit=lines.append)
    assert src.root == lessons.NOTEBOOK_DIR and src.source
    assert "INSTRUCTOR'S SOURCE" in lines[-1] and "already in" in lines[-2]
    src.started(object())  # nothing to write for the source
    assert not (lessons.NOTEBOOK_DIR / home.HOME_NAME).exists()
    parsed = cli.build_parser().parse_args(["lab", "--source", "--workdir", "x", "--", "--y"])
    assert parsed.source and parsed.workdir == "x"


def _page_config(folder: Path) -> dict:
    return json.loads((folder / "labconfig" / "page_config.json").read_text())


def test_the_learners_lab_hides_nbgraders_instructor_tools(tmp_path, kernel_prefix):
    plan = lab.prepare(str(tmp_path / "w"), False, lessons.NOTEBOOK_DIR, emit=lambda _: None)
    hidden = _page_config(plan.config_dir)["disabledExtensions"]
    assert set(hidden) == {labconfig.NEWS_PLUGIN, *labconfig.INSTRUCTOR_PLUGINS}
    assert all(hidden.values())
    assert "@jupyter/nbgrader:create-assignment" in hidden and "@jupyter/nbgrader:menu" in hidden
    env = plan.environment({"JUPYTER_CONFIG_PATH": "/elsewhere", "X": "1"})
    assert env["JUPYTER_CONFIG_PATH"] == f"{plan.config_dir}{os.pathsep}/elsewhere"
    assert env["X"] == "1" and set(labconfig.QUIET_ARGS) <= set(plan.jupyter_args)
    src = lab.prepare(None, True, lessons.NOTEBOOK_DIR, emit=lambda _: None)
    assert _page_config(src.config_dir) == {"disabledExtensions": {labconfig.NEWS_PLUGIN: True}}
    assert set(labconfig.QUIET_ARGS) <= set(src.jupyter_args)
    before = (plan.config_dir / "labconfig" / "page_config.json").stat().st_mtime_ns
    labconfig.write_config_dir(plan.config_dir, False)  # again: unchanged, not rewritten
    assert (plan.config_dir / "labconfig" / "page_config.json").stat().st_mtime_ns == before


def test_the_labs_terminal_finds_the_course_command(tmp_path, kernel_prefix):
    """``course solution 3 ex2`` typed in JupyterLab's terminal runs the course's own command:
    the lab's environment, which its terminals inherit, has this Python's ``bin/`` first."""
    plan = lab.prepare(str(tmp_path / "w"), False, lessons.NOTEBOOK_DIR, emit=lambda _: None)
    env = plan.environment({"PATH": f"/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path)})
    bindir = Path(sys.executable).parent
    assert env["PATH"].split(os.pathsep) == [str(bindir), "/usr/bin", "/bin"]
    found = subprocess.run(["sh", "-c", "command -v course"], env=env, capture_output=True,
                           text=True, check=False)
    assert found.stdout.strip() == str(bindir / "course"), found
    # and the terminal's shell is not a login shell, whose /etc/profile would reset PATH
    server = json.loads((plan.config_dir / "jupyter_server_config.json").read_text())
    shell = server["ServerApp"]["terminado_settings"]["shell_command"]
    assert len(shell) == 1 and "-l" not in shell, shell


def test_jupyterlab_serves_the_learners_page_config(tmp_path):
    """A real ``jupyter lab`` started as ``course lab`` starts it: its page lists the plugins
    as disabled (the browser test checks what the learner then sees)."""
    from course_utils.cluster.ports import free_port
    from tests.rigs import browser as rig

    folder = labconfig.write_config_dir(tmp_path / "cfg", False)
    port = free_port()
    cmd = rig.jupyter_lab_command(tmp_path, port, "t0k", tmp_path / "state")
    env = labconfig.lab_environment(folder, {**os.environ,
                                             "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")})
    with rig.running_lab(cmd + list(labconfig.QUIET_ARGS), port=port, token="t0k",
                         env=env) as server:
        html = server.page("lab")
    found = re.search(r'id="jupyter-config-data"[^>]*>\s*(.*?)\s*</script>', html, re.S)
    assert found, html[:2000]
    config = json.loads(found.group(1))
    assert set(labconfig.INSTRUCTOR_PLUGINS) <= set(config["disabledExtensions"]), config


def test_the_panel_guard_names_the_course_cluster(monkeypatch):
    monkeypatch.setenv("COURSE_CLUSTER_ID", "abc")
    monkeypatch.setenv("COURSE_IPYTHON_PROFILE", "prof")
    assert labpanel.course_cluster_key() == "prof:abc"
    assert labpanel._jupyter_server_extension_points() == [{"module": labpanel.EXTENSION}]
    assert "cu.restart()" in labpanel.REASON

    assert issubclass(workspace.WorkspaceError, CourseError)


def test_px_output_is_labelled_by_rank_in_any_kernel():
    """``cu.start()`` installs the rank labels itself: a plain ``python3`` kernel (not the
    course's kernelspec, which loads them as an extension) shows ``[rank r, engine e]``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import course_utils as cu\ncluster = cu.start()"),
        nbformat.v4.new_code_cell("%%px\nprint('hello from rank', rank)")])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for o in nb.cells[1].outputs)
    for r in (0, 1):
        assert re.search(rf"\[rank {r}, engine \d+\]\s*hello from rank {r}", text), text


def test_the_learners_app_never_imports_the_instructors_tools():
    """The instructor package's promise: learners never import it (what ``course lab`` runs)."""
    code = ("import sys\nfrom course_utils.learner import home, kernelspec, lab, labpanel, "
            "workspace\n"
            "print(sorted(m for m in sys.modules if m.startswith('course_utils.instructor')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"
