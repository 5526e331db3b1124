"""The order in which ``make test``'s workers take the suite's files: the longest first.

Under ``--dist loadfile`` each worker takes whole files, the next one from a queue whenever it
runs low. pytest-xdist orders that queue by the number of tests in each file; a notebook's
cells count as tests, so a notebook of quick cells went first and a long file of few tests
(the workshop rig's, six minutes) could start while the other workers were nearly done. Here
the queue follows :data:`SECONDS` instead (pyproject passes ``--no-loadscope-reorder``, and
the collection is sorted before the workers report it): the longest files start first and
the short ones fill the end, as in longest-processing-time scheduling.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: Test-seconds per file (setup, call and teardown of its tests) in one clean run of ``make
#: test`` (cc69, 2026-12-07, 2 cores); files not named here take under 5 s and go last, in
#: the order pytest collects them. Rough is enough: only the order matters.
SECONDS = {
    "tests/test_workshop.py": 358,
    "tests/test_two_hosts.py": 222,
    "tests/test_instructor_grade.py": 170,
    "tests/test_cluster.py": 129,
    "notebooks/04_tf_classic_ps.ipynb": 112,
    "tests/test_cli.py": 106,
    "tests/test_slurm.py": 103,
    "tests/test_lab_browser.py": 101,
    "tests/test_engine_fork.py": 98,
    "notebooks/06_two_hosts.ipynb": 93,
    "notebooks/11_tensor_and_pipeline.ipynb": 90,
    "notebooks/10_sharding_and_memory.ipynb": 83,
    "notebooks/01_collectives.ipynb": 80,
    "tests/test_tf_dist.py": 72,
    "notebooks/08_hangs_and_faults.ipynb": 65,
    "notebooks/09_capstone.ipynb": 56,
    "notebooks/05_tf2_parameter_server_strategy.ipynb": 56,
    "tests/test_authoring.py": 53,
    "notebooks/00_cluster_tour.ipynb": 50,
    "tests/test_spawn.py": 48,
    "notebooks/03_pytorch_ddp.ipynb": 46,
    "tests/test_viz_gallery.py": 44,
    "tests/test_learner_lab.py": 37,
    "notebooks/07_performance.ipynb": 30,
    "tests/test_grade_sandbox.py": 30,
    "tests/test_rig_browser.py": 29,
    "tests/test_viz_tf.py": 23,
    "tests/test_torch_track.py": 20,
    "tests/test_install.py": 19,
    "tests/test_instructor_release.py": 17,
    "tests/test_viz_torch.py": 17,
    "tests/test_nccl_acceptance.py": 15,
    "notebooks/02_data_parallel_from_scratch.ipynb": 14,
    "tests/test_pure.py": 13,
    "tests/test_unit04_05.py": 12,
    "tests/test_integrity.py": 10,
    "tests/test_unit10.py": 10,
    "tests/test_tf_perf_capstone.py": 9,
    "tests/test_instructor_slides.py": 9,
    "tests/test_rig_slurm.py": 7,
    "tests/test_tutorial_shape.py": 7,
    "tests/test_rig_twohosts.py": 7,
    "tests/test_tf_track.py": 6,
    "tests/test_unit11.py": 6,
}


def file_of(path: Path, root: Path) -> str:
    """A test item's file as :data:`SECONDS` names it (relative to the checkout, with ``/``)."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def longest_first(files: Iterable[str]) -> dict[str, int]:
    """Each file's place in the queue: by :data:`SECONDS`, longest first; the files it does not
    name after them, in the order given."""
    given = {f: i for i, f in enumerate(dict.fromkeys(files))}
    ranked = sorted(given, key=lambda f: (-SECONDS.get(f, 0), given[f]))
    return {f: i for i, f in enumerate(ranked)}


def sort_items(items: list, root: Path) -> None:
    """Sort pytest's ``items`` in place so that whole files follow :func:`longest_first`; each
    file's own tests keep their order (a notebook's cells must)."""
    place = longest_first(file_of(item.path, root) for item in items)
    items.sort(key=lambda item: place[file_of(item.path, root)])
