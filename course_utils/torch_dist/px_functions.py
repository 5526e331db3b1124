"""*Engine side.* Read back the ``%%px`` cells that defined some of the learner's names on an
engine, with what those cells use, so that
:func:`course_utils.checks.spawn.spawn` can run them on ranks of their own. Not collective;
standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..cluster.engines.engine import px_name

#: Names every rank gets from the course itself (never carried from an engine).
RANK_NAMES = frozenset({"rank", "world_size", "local_rank", "host", "device"})

#: Plain values a cell may use from an earlier cell (a constant such as ``LR``).
_PLAIN = (bool, int, float, str, type(None))


def engine_cells(names: Iterable[str]) -> dict[str, Any]:
    """The ``%%px`` cells that defined each of ``names`` (a function or a class), each once,
    read back from the file name IPython compiled it under, and what they use from earlier
    cells: ``{"sources": [cell, ...], "imports": {alias: "module" or "module:attr"},
    "values": {name: plain value}}``; a cell found through another one comes before it.
    Introduced for the checks of ``00_cluster_tour``."""
    import types

    import __main__

    ns = vars(__main__)
    named = list(names)
    cells: list[str] = []   # the named ones in order, then those found through them
    used: set[str] = set()
    todo = list(named)
    while todo:  # the named cells, and the cells of the %%px functions and classes they use
        body = _cell_of(ns, todo.pop(0))
        if body in cells:
            continue
        cells.append(body)
        found = _global_names(compile(body, "<cell>", "exec")) - RANK_NAMES - used
        used |= found
        todo += [g for g in sorted(found) if getattr(ns.get(g), "__module__", "") == "__main__"
                 and isinstance(ns[g], type | types.FunctionType)]
    first = len({_cell_of(ns, n) for n in named})
    sources = cells[first:][::-1] + cells[:first]
    imports, values = {}, {}
    for g in sorted(used & ns.keys()):
        where = _import_of(ns[g])
        if where:
            imports[g] = where
        elif isinstance(ns[g], _PLAIN) or (isinstance(ns[g], tuple)
                                            and all(isinstance(v, _PLAIN) for v in ns[g])):
            values[g] = ns[g]
    return {"sources": sources, "imports": imports, "values": values}


def _cell_of(ns: dict[str, Any], name: str) -> str:
    import linecache

    obj = px_name(name)
    funcs = [obj] if hasattr(obj, "__code__") else [
        getattr(f, "__func__", f) for f in vars(obj).values()] if obj is not None else []
    code = next((f.__code__ for f in funcs if hasattr(f, "__code__")), None)
    if code is None:
        raise NameError(f"{name!r} was not defined by a cell of its own: define it with def or "
                        "class in a %%px cell, and run that cell")
    body = "".join(linecache.getlines(code.co_filename))
    if not body:
        raise NameError(f"the cell that defined {name!r} cannot be read back: run it again")
    return body


def _global_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def _import_of(value: Any) -> str:
    """``"module"`` for a module, ``"module:attr"`` for a name imported from one, else ``""``."""
    import importlib
    import types

    if isinstance(value, types.ModuleType):
        return value.__name__
    mod, attr = getattr(value, "__module__", None), getattr(value, "__name__", "")
    if not mod or mod == "__main__" or not attr:
        return ""
    try:
        return f"{mod}:{attr}" if getattr(importlib.import_module(mod), attr, None) is value \
            else ""
    except Exception:   # a module that cannot be imported by name: not carried
        return ""
