"""The mutation operators: each turns one node of a solution region into a learner's slip.

A mutant is the whole solution cell with one change inside a ``### BEGIN SOLUTION`` ..
``### END SOLUTION`` region, spliced into the original text by the changed node's position
(comments, layout and the ``%%px`` line are kept). The operators, one name each (the name
starts the mutant's id):

``delete``     a call made as a statement, or an augmented assignment (``t /= p``), becomes ``pass``
``collective`` a collective becomes a neighbour that is not the same thing: ``all_reduce`` ->
               ``reduce`` to rank 0, ``all_gather`` -> a local copy, ``reduce_scatter`` ->
               ``all_reduce`` then the own slice, ``broadcast`` -> nothing sent; a
               ``ReduceOp`` becomes another
``name``       a rank, size or index name read becomes a sibling bound in scope
               (``rank`` -> ``local_rank``); so does an attribute of that name
               (``self.rank`` -> ``local_rank``, the engine's global a slip reaches for)
``constant``   an integer in arithmetic, a comparison, an index or ``range()`` becomes ``c + 1`` and
               ``c - 1``; a name used as an index ``x[i]`` becomes ``x[i + 1]`` and ``x[i - 1]``
               and a name given to ``range()`` becomes ``n + 1`` and ``n - 1``
``round``      ``ceil`` <-> ``floor``
``compare``    ``<`` <-> ``<=``, ``>`` <-> ``>=``
``flag``       a keyword argument ``True`` <-> ``False``
``keyword``    a keyword argument dropped (``map_location=``, ``timeout=``, ``op=``, ...)
``value``      a returned value replaced by a zero of its type (the right type, not the answer)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

OPERATORS = ("delete", "collective", "name", "constant", "round", "compare", "flag",
             "keyword", "value")

#: Names a slip swaps for a sibling of the same kind: ranks, sizes, indices.
ROLES = (
    frozenset({"rank", "local_rank", "global_rank", "node_rank", "task_index", "r", "src",
               "dst", "left", "right", "peer", "owner"}),
    frozenset({"world_size", "local_world_size", "nprocs", "p", "world", "n_ranks"}),
    frozenset({"i", "j", "k", "idx", "index", "step", "epoch", "start", "end", "lo", "hi"}),
)
ROLE_NAMES = frozenset().union(*ROLES)

REDUCE_OPS = {"SUM": "AVG", "AVG": "SUM", "MAX": "MIN", "MIN": "MAX", "PRODUCT": "SUM"}
COMPARISONS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
ZERO_OF = ('(lambda _v: _v.new_zeros(_v.shape) if hasattr(_v, "new_zeros") '
           'else type(_v)())({})')


@dataclass(frozen=True)
class Mutant:
    """One change of a solution cell: ``source`` is the whole mutated cell."""

    grade_id: str
    operator: str
    line: int      # the changed line, counted from the cell's first line (1)
    before: str    # that line, before and after the change (stripped, shortened)
    after: str
    source: str
    nth: int = 0   # the same change of the same line made elsewhere in the cell before

    @property
    def id(self) -> str:
        """Stable while the changed line's text stays: what the equivalent list and the report
        name."""
        again = f" #{self.nth + 1}" if self.nth else ""
        return f"{self.grade_id}/{self.operator}: {self.before} -> {self.after}{again}"


def regions(source: str) -> list[tuple[int, int]]:
    """The cell's solution regions as (first, last) line numbers (1-based) of their code."""
    out, start = [], None
    for n, line in enumerate(source.splitlines(), 1):
        if "### BEGIN SOLUTION" in line:
            start = n + 1
        elif "### END SOLUTION" in line and start is not None:
            out.append((start, n - 1))
            start = None
    return out


def mutants(source: str, grade_id: str, scope: frozenset[str] = frozenset()) -> list[Mutant]:
    """Every mutant of the solution regions of cell ``source`` (``%%`` magic line kept).
    ``scope``: names bound by the notebook's earlier cells, which a ``name`` swap may use."""
    magic = 1 if source.startswith("%%") else 0
    lines = source.splitlines()
    code = "\n".join(lines[magic:])
    tree = ast.parse(code)
    spans = [(a - magic, b - magic) for a, b in regions(source)]
    first = _first_bound(tree)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    seen, out = set(), []
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or not any(
                a <= node.lineno and node.end_lineno <= b for a, b in spans):
            continue
        bound = scope | {n for n, line in first.items() if line < node.lineno}
        for op, replacement in _changes(node, parent.get(node), frozenset(bound), code):
            new = _splice(code, node, replacement)
            if new == code or new in seen:
                continue
            seen.add(new)
            shift = len(new.splitlines()) - len(code.splitlines())
            row = node.lineno - 1
            before, after = _shown(" ".join(code.splitlines()[row:node.end_lineno]),
                                   " ".join(new.splitlines()[row:node.end_lineno + shift]))
            text = "\n".join(lines[:magic] + [new]) + ("\n" if source.endswith("\n") else "")
            m = Mutant(grade_id, op, node.lineno + magic, before, after, text)
            out.append(replace(m, nth=sum(replace(o, nth=0).id == m.id for o in out)))
    return out


def _shown(before: str, after: str, width: int = 80) -> tuple[str, str]:
    """The changed line before and after, each on one line; a long pair is cut to the part
    that differs, with some context, so that two changes of one long line read apart."""
    before, after = (re.sub(r"\s+", " ", t).strip() for t in (before, after))
    if max(len(before), len(after)) <= width:
        return before, after or "(gone)"
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while (tail < min(len(before), len(after)) - head
           and before[-1 - tail] == after[-1 - tail]):
        tail += 1
    start = max(0, head - 30)

    def cut(t: str) -> str:
        mid = t[start:len(t) - max(0, tail - 30)]
        more = tail > 30 or len(mid) > width
        return ("..." if start else "") + mid[:width - 3 if more else width] + (
            "..." if more else "")
    return cut(before), cut(after) if after else "(gone)"


def _first_bound(tree: ast.AST) -> dict[str, int]:
    """Each name the code binds, with the first line that binds it (a parameter: its
    function's first line, so the body sees it)."""
    first: dict[str, int] = {}
    # a comprehension's variable is read on the line that binds it
    looped = {id(t) for c in ast.walk(tree) if isinstance(c, ast.comprehension)
              for t in ast.walk(c.target) if isinstance(t, ast.Name)}
    for n in ast.walk(tree):
        if id(n) in looped:
            line = n.lineno - 1
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            line = n.end_lineno  # bound once its statement ran: ``p = p + 1`` reads the old p
        elif isinstance(n, ast.arg):
            line = n.lineno - 1
        else:
            continue
        name = n.id if isinstance(n, ast.Name) else n.arg
        first[name] = min(first.get(name, line), line)
    return first


def bound_names(source: str) -> frozenset[str]:
    """The names code cell ``source`` binds (assignments, loop targets, parameters) where it
    runs: none for a cell magic other than ``%%px`` (``%%writefile``'s text is a file)."""
    if source.startswith("%%") and not source.startswith("%%px"):
        return frozenset()
    try:
        return frozenset(_first_bound(ast.parse(
            "\n".join(ln for ln in source.splitlines() if not ln.startswith("%")))))
    except SyntaxError:
        return frozenset()


def _offset(code: str, line: int, col: int) -> int:
    """The character offset in ``code`` of an ast position (columns are UTF-8 bytes)."""
    lines = code.splitlines(keepends=True)
    return sum(len(ln) for ln in lines[:line - 1]) + len(lines[line - 1].encode()[:col].decode())


def _span(code: str, node: ast.AST) -> tuple[int, int]:
    return (_offset(code, node.lineno, node.col_offset),
            _offset(code, node.end_lineno, node.end_col_offset))


def _splice(code: str, node: ast.AST, text: str) -> str:
    start, end = _span(code, node)
    return code[:start] + text + code[end:]


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _counted(node: ast.AST, parent: ast.AST | None) -> bool:
    """An integer that counts or indexes (not a seed, a port or a timeout)."""
    if isinstance(parent, (ast.BinOp, ast.Compare, ast.UnaryOp)):
        return True
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return True
    if isinstance(parent, ast.Slice):
        return True
    return isinstance(parent, ast.Call) and _call_name(parent) == "range" and node in parent.args


def _changes(node: ast.AST, parent: ast.AST | None, bound: frozenset[str], code: str
             ) -> Iterator[tuple[str, str]]:
    """(operator, replacement source) for each mutant of ``node``."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) or isinstance(
            node, ast.AugAssign):
        yield "delete", "pass"
    if isinstance(node, ast.Call):
        yield from _collective(node)
        yield from _keywords(node, code)
        if _call_name(node) in ("ceil", "floor"):
            other = "floor" if _call_name(node) == "ceil" else "ceil"
            f = node.func
            func = (f"{ast.unparse(f.value)}.{other}" if isinstance(f, ast.Attribute) else other)
            yield "round", f"{func}({', '.join(ast.unparse(a) for a in node.args)})"
    if isinstance(node, ast.Attribute) and node.attr in REDUCE_OPS and isinstance(
            node.value, ast.Attribute) and node.value.attr == "ReduceOp":
        yield "collective", f"{ast.unparse(node.value)}.{REDUCE_OPS[node.attr]}"
    role_name = node.id if isinstance(node, ast.Name) else (
        node.attr if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.attr in ROLES[0] | ROLES[1] and not (  # ranks and sizes, not methods
            isinstance(parent, ast.Call) and parent.func is node) else None)
    if role_name in ROLE_NAMES and isinstance(getattr(node, "ctx", None), ast.Load):
        kind = next(group for group in ROLES if role_name in group)
        for other in sorted((bound & kind) - {role_name}):
            yield "name", other
    if isinstance(node, ast.Constant) and type(node.value) is int and _counted(node, parent):
        yield "constant", str(node.value + 1)
        yield "constant", str(node.value - 1)
    if isinstance(node, ast.Name) and isinstance(parent, ast.Call) and _call_name(
            parent) == "range" and node in parent.args:
        yield "constant", f"{node.id} + 1"
        yield "constant", f"{node.id} - 1"
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name):
        for sign in "+-":
            yield "constant", f"{ast.unparse(node.value)}[{node.slice.id} {sign} 1]"
    if isinstance(node, ast.Constant) and type(node.value) is bool and isinstance(
            parent, ast.keyword):
        yield "flag", str(not node.value)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARISONS:
        swapped = ast.Compare(node.left, [COMPARISONS[type(node.ops[0])]()], node.comparators)
        yield "compare", ast.unparse(swapped)
    if isinstance(node, ast.Return) and node.value is not None and not _empty(node.value):
        yield "value", "return " + ZERO_OF.format(ast.unparse(node.value))


def _empty(node: ast.AST) -> bool:
    """A constant, or an empty list, tuple, dict or set: its zero is itself."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return not node.elts
    return isinstance(node, ast.Dict) and not node.keys


def _keywords(node: ast.Call, code: str) -> Iterator[tuple[str, str]]:
    """The call without one of its keyword arguments, the rest of its text as it was."""
    start, end = _span(code, node)
    parts = [*node.args, *node.keywords]
    for kw in node.keywords:
        if kw.arg is None:
            continue
        i = parts.index(kw)
        a, b = _span(code, kw)
        if i > 0:    # from the end of the argument before it
            a = _span(code, parts[i - 1])[1]
        elif len(parts) > 1:  # the first: up to the argument after it
            b = _span(code, parts[1])[0]
        yield "keyword", code[start:a] + code[b:end]


def _collective(node: ast.Call) -> Iterator[tuple[str, str]]:
    """A collective's neighbour: the same call shape, another meaning."""
    name = _call_name(node)
    f = node.func
    mod = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
    pre = f"{mod}." if mod else ""
    args = [ast.unparse(a) for a in node.args]
    kws = [ast.unparse(k) for k in node.keywords]
    rank = f"{pre}get_rank()"
    if name == "all_reduce" and args:
        yield "collective", f"{pre}reduce({', '.join([args[0], '0', *args[1:], *kws])})"
    elif name == "all_gather" and len(args) >= 2:
        yield "collective", f"[_o.copy_({args[1]}) for _o in {args[0]}]"
    elif name in ("all_gather_single", "all_gather_into_tensor") and len(args) >= 2:
        out, inp = args[:2]
        yield "collective", (f"{out}.copy_({inp}.reshape(1, -1).expand("
                             f"{out}.numel() // {inp}.numel(), -1).reshape({out}.shape))")
    elif name in ("reduce_scatter_single", "reduce_scatter_tensor") and len(args) >= 2:
        out, inp = args[:2]
        yield "collective", (f"({pre}all_reduce({inp}), {out}.copy_({inp}.chunk("
                             f"{pre}get_world_size())[{rank}].reshape({out}.shape)))")
    elif name == "reduce_scatter" and len(args) >= 2:
        out, inp = args[:2]
        yield "collective", (f"({pre}all_reduce({inp}[{rank}]), "
                             f"{out}.copy_({inp}[{rank}]))")
    elif name == "broadcast" and args:
        yield "collective", "None"
