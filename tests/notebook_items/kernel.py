"""nbval's kernel for one notebook, as the plugin's items use it: :func:`execute` runs a cell's
source there through nbval's own ``RunningKernel`` (``execute_cell_input``, ``await_reply``,
``get_message``), and a :class:`Walk` records which of the notebook's original cells have run in
it and which graded tests failed, and puts the ranks' process group back after a mistake."""

from __future__ import annotations

import queue
import time

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.assignments.release import student_notebooks
from course_utils.notebook_cells import is_teardown, is_test_cell, nbgrader_meta

#: Defines, in the notebook's kernel, what :meth:`Walk.group_state` asks every rank.
PROBE = '''
import course_utils as _cu


def _course_group_state():
    """none: no process group; clean: one that answers; broken: one that does not."""
    import datetime
    import sys

    if "torch.distributed" not in sys.modules:
        return "none"
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return "none"
    r, p, wait = dist.get_rank(), dist.get_world_size(), datetime.timedelta(seconds=3)
    try:
        total = torch.ones(1)
        dist.all_reduce(total, async_op=True).wait(timeout=wait)
        got, mine = torch.empty(1), torch.full((1,), float(r))
        reqs = [dist.isend(mine, (r + 1) % p), dist.irecv(got, (r - 1) % p)]
        for q in reqs:
            q.wait(timeout=wait)
    except Exception:
        return "broken"
    return "clean" if total.item() == p and got.item() == float((r - 1) % p) else "broken"


def _course_group_leave():
    import torch.distributed as dist

    dist.destroy_process_group()


def _course_state():
    try:
        states = set(_cu.current().run(_course_group_state, timeout=15))
    except Exception:
        return "broken"
    return states.pop() if len(states) == 1 else "broken"
'''


def cell_index(item) -> int:
    """Where nbval's item ``item`` sits among its notebook's cells (nbval's ``cell_num``
    counts code cells only; ``item.cell`` is the cell of ``item.parent.nb``)."""
    return next(i for i, c in enumerate(item.parent.nb.cells) if c is item.cell)



#: Seconds a catalogue cell may run (nbclient's limit when the catalogue had its own kernel).
CELL_TIMEOUT = 300


def execute(kernel, source: str, timeout: float = CELL_TIMEOUT) -> tuple[list[str], float, str]:
    """Run ``source`` in nbval's kernel: its errors (``"ename: evalue"``), its seconds from
    the request to the kernel's idle, and what it printed."""
    msg_id = kernel.execute_cell_input(source, allow_stdin=False)
    t0 = time.perf_counter()
    try:
        kernel.await_reply(msg_id, timeout=timeout)
    except queue.Empty:
        kernel.interrupt()
        raise AssertionError(f"a catalogue cell ran past {timeout} s: {source[:200]!r}") from None
    errors, printed = [], []
    while True:
        msg = kernel.get_message("iopub", timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            break
        if kind == "error":
            errors.append(f"{content.get('ename')}: {content.get('evalue')}")
        elif kind == "stream" and content.get("name") == "stdout":
            printed.append(content.get("text", ""))
    return errors, time.perf_counter() - t0, "".join(printed)


class Walk:
    """One notebook's nbval kernel, as the catalogue sees it: the original cells ``[0, done)``
    ran (nbval's items, or :meth:`run_original`), and which graded tests failed doing so."""

    def __init__(self, nbfile) -> None:
        self.nbfile = nbfile
        self.name = nbfile.path.name
        self.nb = read(NOTEBOOK_DIR / self.name)
        self.done = 0
        self.failed_tests: list[str] = []
        self.errors: list[str] = []
        self._released = None

    def execute(self, cell) -> tuple[list[str], float]:
        errors, seconds, _ = execute(self.nbfile.kernel, cell.source)
        return errors, seconds

    def ran(self, index: int, errors: list[str]) -> None:
        """Cell ``index`` ran in its original form (here or as nbval's item)."""
        cell = self.nb.cells[index]
        if errors:   # a lesson cell's error explains a graded test's failure below it
            self.errors.append(f"{nbgrader_meta(cell).get('grade_id', index)}: {errors[0][:300]}")
        if errors and is_test_cell(cell):
            self.failed_tests.append(f"{nbgrader_meta(cell)['grade_id']}: {errors[0][:200]}")
        self.done = max(self.done, index + 1)

    def run_original(self, upto: int) -> None:
        """Run the original cells [done, upto) that have not run (a restart, a -k subset)."""
        for i in range(self.done, upto):
            cell = self.nb.cells[i]
            if cell.cell_type != "code" or is_teardown(cell):
                continue
            self.ran(i, self.execute(cell)[0])
        self.done = max(self.done, upto)

    def wait_until_idle(self, limit: float = 30.0) -> None:
        """Until no rank is busy (a %%px cell can fail while other ranks still run it)."""
        execute(self.nbfile.kernel, f"import time as _t\n_end = _t.monotonic() + {limit}\n"
                "while _cu.current().busy() and _t.monotonic() < _end:\n    _t.sleep(0.2)\n",
                timeout=limit + 30)

    def group_state(self) -> str:
        """The ranks' process group: ``none``, ``clean`` (it answers) or ``broken``."""
        errors, _, said = execute(self.nbfile.kernel, PROBE + "print(_course_state())",
                                  timeout=60)
        return "broken" if errors else said.strip()

    def engines_hold_tensorflow(self) -> bool:
        """Whether TensorFlow is loaded on the engines: a TF server cannot be stopped inside
        its process, so what a changed cell started there stays until the engines go."""
        errors, _, said = execute(self.nbfile.kernel, "print(any(_cu.current().run(lambda: "
                                  "'tensorflow' in __import__('sys').modules, timeout=15)))",
                                  timeout=60)
        return bool(errors) or said.strip() == "True"

    def make_clean(self, before: str, upto: int, renew: bool = False) -> bool:
        """After a mistake, give nbval's next item the kernel it expects: the ranks' process
        group as it was ``before`` the mistake. A group the mistake left where there was none
        is destroyed (a ``leave_group`` that does not leave); otherwise, if the group changed
        or stopped answering (or ``renew``: whatever the engines hold), the engines are
        restarted and the original cells [0, upto) run again. Returns whether the group was
        damaged (changed or not answering)."""
        after = self.group_state()
        if after == "clean" and before == "none":
            execute(self.nbfile.kernel, "_cu.current().run(_course_group_leave, timeout=15)",
                    timeout=60)
            after = self.group_state()
        print(f"catalogue: the group was {before!r} before, {after!r} after"
              + (": restarting the engines" if after != before or renew else ""))
        if after != before or renew:
            errors, _, _ = execute(self.nbfile.kernel, "cluster = _cu.restart()")
            assert not errors, f"the catalogue could not restart the engines: {errors}"
            self.done = 0
            self.run_original(upto)
        self.done = upto
        return after != before

    def released(self):
        """This notebook as ``course release`` hands it out (cached)."""
        if self._released is None:
            self._released = student_notebooks([NOTEBOOK_DIR / self.name])[0]
        return self._released


_WALKS: dict[str, Walk] = {}


def walk_of(nbfile) -> Walk:
    if nbfile.nodeid not in _WALKS:
        _WALKS[nbfile.nodeid] = Walk(nbfile)
    return _WALKS[nbfile.nodeid]
