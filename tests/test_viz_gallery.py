"""``course viz-gallery``: every figure of the course from real runs, as a reviewer runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from course_utils.instructor.gallery import (
    FIGURES,
    NOTEBOOKS,
    UNIT1_CELLS,
    UNIT2_CELLS,
    UNIT4_CELLS,
    UNIT10_CELLS,
    UNIT11_CELLS,
    px_code,
)


def test_px_code_takes_cells_by_their_ids_in_the_order_given():
    nb04 = NOTEBOOKS / "04_tf_classic_ps.ipynb"
    code = px_code(nb04, ["ex3-solution", "ex2-solution"])
    assert "%%px" not in code and code.index("def train(") < code.index("def build_graph(")
    for nb, ids in (("01_collectives", UNIT1_CELLS), ("02_data_parallel_from_scratch", UNIT2_CELLS),
                    ("04_tf_classic_ps", UNIT4_CELLS),
                    ("10_sharding_and_memory", UNIT10_CELLS),
                    ("11_tensor_and_pipeline", UNIT11_CELLS)):
        compile(px_code(NOTEBOOKS / f"{nb}.ipynb", ids), nb, "exec")  # every id is there
    with pytest.raises(LookupError, match="no_such_cell"):
        px_code(nb04, ["ex2-solution", "no_such_cell"])


def test_viz_gallery_writes_every_figure_from_real_runs(tmp_path):
    out = tmp_path / "gallery"
    env = {**os.environ, "COURSE_CLUSTER_ID": f"pytest-gallery-{os.getpid()}",
           "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "course_utils.cli", "viz-gallery", str(out)],
                          capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - t0
    print(f"course viz-gallery: {seconds:.0f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    index = (out / "index.html").read_text()
    assert f"{len(FIGURES)} figures from real runs" in index and "; 0 failed" in index
    for name, title in FIGURES:
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"src='{name}.png'" in index
        assert title.split(" (")[0].split(":")[0] in index
    assert "<script" in (out / "ring_replay_1.html").read_text()
    # one line per figure on the run behind it, with its time
    assert len(re.findall(r"<b>run:</b>[^<]+\(\d+\.\d s\)", index)) == len(FIGURES)
