"""tools/gpu_check.py (the GPU machine's check, run by hand): what it runs of each notebook."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gpu_check)


def _cells(name: str) -> list:
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    return gpu_check.lesson_cells(nb)


def test_tensorflow_sections_are_left_out_and_the_probe_comes_before_teardown():
    for name in gpu_check.NOTEBOOKS:
        cells = _cells(name)
        code = "\n".join(c.source for c in cells if c.cell_type == "code")
        assert "quiet_tensorflow" not in code and "tf_perf" not in code, name
        heads = [c.source for c in cells if c.cell_type == "markdown"]
        assert not any(h.lstrip().startswith(gpu_check.TF_SECTIONS) for h in heads), name
        at = next(i for i, c in enumerate(cells) if c.source.startswith("## Teardown"))
        assert cells[at - 1].source == gpu_check.PROBE, name
        assert cells[at + 1].cell_type == "code", name  # the teardown itself still runs


def test_unit9_keeps_its_torch_part_and_unit7_its_lesson():
    assert any("Exercise 2 — the training run" in c.source for c in _cells("09_capstone"))
    assert any("Exercise 2 — overlap" in c.source for c in _cells("07_performance"))


def test_the_graduation_script_is_unit6s_solution(tmp_path):
    path = gpu_check.graduation_script(tmp_path)
    src = path.read_text()
    assert not src.startswith("%%writefile") and "def main(" in src
    compile(src, str(path), "exec")


def test_only_the_checks_that_compare_ranks_are_expected_to_fail_on_one_rank():
    sampler = "cell 10: AssertionError: checked:  which items rank 0 gets in epochs 0 and 1"
    resume = "cell 36: AssertionError: checked:  max |w_resumed - w_uninterrupted| on each rank"
    assert gpu_check.split_one_rank([sampler, resume], "nccl-1-rank") == ([resume], [sampler])
    assert gpu_check.split_one_rank([sampler], "gloo-2-ranks") == ([sampler], [])
