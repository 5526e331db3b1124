"""Re-running in the same kernel, as a learner does it, inside nbval's run of three notebooks:

* ``01_collectives`` (torch) and ``04_tf_classic_ps`` (TF): after nbval's last item, the
  teardown, the whole notebook runs again in the same kernel: set-up and teardown are idempotent
  (the cluster and the gloo group, or the TF servers, are started, stopped and started again);
* ``03_pytorch_ddp``: just before the teardown, every cell runs again against the live cluster,
  process group and DDP model, and each set-up cell reuses what its first run started.

nbval's own run is the first pass (with the mistakes catalogue planted in it, which must leave
nothing behind), so each notebook runs once more, not twice more. A plan's letters: ``B`` every
code cell but the teardown, ``T`` the teardown (the cell marked ``metadata.course.teardown``,
the last code cell: ``tests/test_rerun.py`` checks that every notebook ends with it).
"""

from __future__ import annotations

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.notebook_cells import grade_id, is_teardown

from .kernel import execute

#: notebook -> (the plan run again, whether it runs before nbval's teardown item or after it)
PLANS = {
    "01_collectives.ipynb": ("BT", "after"),
    "04_tf_classic_ps.ipynb": ("BT", "after"),
    "03_pytorch_ddp.ipynb": ("B", "before"),
}
CELL_TIMEOUT = 600  # as nbval's --nbval-cell-timeout in pyproject.toml


class RerunItem(pytest.Item):
    """Run the notebook's cells again by ``plan`` in nbval's kernel for it."""

    def __init__(self, *, plan: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.plan = plan

    def runtest(self) -> None:
        name = self.parent.path.name
        code = [(i, c) for i, c in enumerate(read(NOTEBOOK_DIR / name).cells)
                if c.cell_type == "code"]
        steps = {"B": [ic for ic in code if not is_teardown(ic[1])],
                 "T": [ic for ic in code if is_teardown(ic[1])]}
        assert steps["T"], f"{name} has no teardown cell (metadata.course.teardown)"
        ran = ""
        try:
            for step in self.plan:
                for index, cell in steps[step]:
                    errors, _, _ = execute(self.parent.kernel, cell.source, CELL_TIMEOUT)
                    assert not errors, (
                        f"{name}: cell {index} ({grade_id(cell) or 'lesson'}) failed when run "
                        f"again (plan {self.plan!r}, after {ran or 'nothing'}): {errors[0]}")
                ran += step
        finally:
            if "T" in self.plan and not ran.endswith("T"):  # no engines outlive a failed pass
                for _, cell in steps["T"]:
                    execute(self.parent.kernel, cell.source, CELL_TIMEOUT)

    def reportinfo(self):
        return self.path, None, f"{self.parent.path.name}::{self.name}"


def place(items: list) -> None:
    """Each planned notebook's re-run goes just after (or before) its teardown item."""
    from nbval.plugin import IPyNbCell

    last: dict[str, int] = {}
    for pos, item in enumerate(items):
        if isinstance(item, IPyNbCell) and item.parent.path.name in PLANS:
            last[item.parent.path.name] = pos
    for name, pos in sorted(last.items(), key=lambda kv: -kv[1]):  # from the end: positions hold
        plan, where = PLANS[name]
        teardown = items[pos]
        rerun = RerunItem.from_parent(teardown.parent, name=f"run_again_{plan}", plan=plan)
        items.insert(pos + 1 if where == "after" else pos, rerun)
