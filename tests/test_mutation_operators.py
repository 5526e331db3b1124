"""tools/mutation/operators.py: mutants of a solution region, without a kernel."""

from __future__ import annotations

import ast
import json

from course_utils.assignments.lessons import NOTEBOOK_DIR
from course_utils.notebook_cells import is_solution_cell, source_text
from tools.mutation.operators import OPERATORS, bound_names, mutants, regions

CELL = '''%%px
import math
import torch.distributed as dist
keep = dist.get_rank()  # outside the region: never changed
def average(t, rank, world_size, timeout=None):
    ### BEGIN SOLUTION
    dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=False)
    t /= world_size
    n = math.ceil(t.numel() / world_size)
    if rank < world_size - 1:
        return t[rank]
    return t
    ### END SOLUTION
'''


def by_op(ms):
    out = {}
    for m in ms:
        out.setdefault(m.operator, []).append((m.before, m.after))
    return out


def test_each_operator_makes_its_slip_inside_the_region_only():
    ms = mutants(CELL, "ex-solution", frozenset({"local_rank"}))
    ops = by_op(ms)
    assert set(ops) <= set(OPERATORS) and {"delete", "collective", "name", "constant", "round",
                                            "compare", "flag", "keyword", "value"} <= set(ops)
    assert ("dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=False)", "pass") in ops["delete"]
    assert ("t /= world_size", "pass") in ops["delete"]
    assert any("dist.reduce(t, 0, op=dist.ReduceOp.SUM" in a for _, a in ops["collective"])
    assert any("ReduceOp.AVG" in a for _, a in ops["collective"])
    assert any("math.floor(" in a for _, a in ops["round"])
    assert any("rank <= world_size - 1" in a for _, a in ops["compare"])
    assert any("async_op=True" in a for _, a in ops["flag"])
    assert any(a.endswith("op=dist.ReduceOp.SUM)") for _, a in ops["keyword"])
    assert any("world_size - 2" in a for _, a in ops["constant"])
    assert any("t[rank + 1]" in a for _, a in ops["constant"])
    assert any("t[local_rank]" in a for _, a in ops["name"])  # a sibling from an earlier cell
    for m in ms:
        assert m.source.startswith("%%px\n") and "keep = dist.get_rank()" in m.source
        ast.parse(m.source.split("\n", 1)[1])  # every mutant is Python
        first, last = regions(m.source)[0]
        assert first <= m.line <= last
    assert len({m.id for m in ms}) == len(ms)
    empty = ("def f(x):\n    ### BEGIN SOLUTION\n    if x:\n        return []\n"
             "    return {}\n    ### END SOLUTION\n")
    assert not [m for m in mutants(empty, "g") if m.operator == "value"]  # each is its own zero


def test_a_name_is_swapped_only_for_a_sibling_already_bound():
    cell = "### BEGIN SOLUTION\nr = rank\nleft = (r - 1) % p\n### END SOLUTION\n"
    swaps = [m.after for m in mutants(cell, "g", frozenset({"rank", "p", "world_size"}))
             if m.operator == "name"]
    assert "r = left" not in swaps          # left is bound after that line
    assert "left = (rank - 1) % p" in swaps and "left = (r - 1) % world_size" in swaps
    assert not any("% r" in s for s in swaps)  # a rank never stands for a size
    # an attribute of a role's name (a class that asked its group) swaps the same way
    cell = "### BEGIN SOLUTION\nn = self.world_size * self.rank\n### END SOLUTION\n"
    swaps = [m.after for m in mutants(cell, "g", frozenset({"local_rank", "p"}))
             if m.operator == "name"]
    assert sorted(swaps) == ["n = p * self.rank", "n = self.world_size * local_rank"]
    assert bound_names("%%px\n%matplotlib inline\nq = 1\n") == {"q"}
    assert bound_names("%%writefile train.py\nq = 1\n") == frozenset()  # a file, not names


def only_literals(src: str) -> bool:
    """An answer that is literal data (a prediction "zero", unit 6's ``#SBATCH`` lines): no
    operator here changes a chosen answer or a line of text; its wrong choices are what its
    test checks (and the catalogue's mistakes)."""
    tree = ast.parse("\n".join(ln for ln in src.splitlines() if not ln.startswith("%")))

    def literal(node: ast.AST) -> bool:
        try:
            ast.literal_eval(node)
        except ValueError:
            return False
        return True

    return all(isinstance(n, ast.Assign) and literal(n.value) for n in tree.body)


def test_every_graded_solution_cell_of_the_course_gives_mutants():
    """With the names the notebook's earlier cells bind in scope, as the runner passes them."""
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        scope: frozenset[str] = frozenset()
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = source_text(cell)
            if is_solution_cell(cell) and regions(src) and not only_literals(src):
                assert mutants(src, "g", scope), f"{path.name}: no mutant of {src[:80]!r}"
            scope |= bound_names(src)
