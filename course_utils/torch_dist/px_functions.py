"""The learner's ``%%px`` functions on an engine: look one up by name, snapshot it with what it
uses, and rebuild it on another cluster's engines (the ring replay records the learner's ring on 4
ranks that way). Engine side, not collective; standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def px_function(name: str) -> Callable[..., Any]:
    """The function ``name`` that a ``%%px`` cell defined on this engine (engine side; what
    the recorders of ``01_collectives`` call the learner's ring through)."""
    import __main__

    fn = vars(__main__).get(name)
    if not callable(fn):
        raise NameError(f"{name!r} is not defined on this engine: run the %%px cell first")
    return fn


def _global_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


#: Names every engine gets from the course itself (never copied between clusters).
_ENGINE_NAMES = {"rank", "world_size", "local_rank", "host", "device"}


def engine_snapshot_of(name: str) -> bytes:
    """The ``%%px`` function ``name`` as a portable snapshot: its source, the sources of the
    ``%%px`` functions it calls, the modules and imported functions it uses, and its other
    globals (pickled). Bytes, so the kernel forwards it without unpickling (no torch there).
    Not collective. :func:`engine_restore` rebuilds it on another cluster's engines."""
    import importlib
    import inspect
    import pickle
    import textwrap
    import types

    import __main__

    ns = vars(__main__)
    if not callable(ns.get(name)):
        raise NameError(f"{name!r} is not defined on this engine: run the %%px cell first")
    sources: dict[str, str] = {}
    modules: dict[str, str] = {}
    froms: dict[str, tuple[str, str]] = {}
    values: dict[str, bytes] = {}
    todo = [name]
    while todo:
        fname = todo.pop()
        if fname in sources:
            continue
        fn = ns[fname]
        sources[fname] = textwrap.dedent(inspect.getsource(fn))
        for g in sorted(_global_names(fn.__code__)):
            if g in _ENGINE_NAMES or g in sources or g not in ns:
                continue
            v = ns[g]
            mod = getattr(v, "__module__", None)
            if isinstance(v, types.ModuleType):
                modules[g] = v.__name__
            elif isinstance(v, types.FunctionType) and mod == "__main__":
                todo.append(g)
            elif callable(v) and mod and mod != "__main__" and \
                    getattr(importlib.import_module(mod), getattr(v, "__name__", ""), None) is v:
                froms[g] = (mod, v.__name__)
            else:
                try:
                    values[g] = pickle.dumps(v)
                except Exception:  # an unpicklable global: the function will say it is missing
                    pass
    return pickle.dumps({"name": name, "sources": list(reversed(sources.values())),
                         "modules": modules, "froms": froms, "values": values})


def engine_restore(snapshot: bytes) -> str:
    """Rebuild a function from :func:`engine_snapshot_of` in this engine's ``%%px``
    namespace; returns its name. Not collective."""
    import importlib
    import pickle

    import __main__

    ns = vars(__main__)
    snap = pickle.loads(snapshot)
    for alias, mod in snap["modules"].items():
        ns[alias] = importlib.import_module(mod)
    for alias, (mod, attr) in snap["froms"].items():
        ns[alias] = getattr(importlib.import_module(mod), attr)
    for g, blob in snap["values"].items():
        ns[g] = pickle.loads(blob)
    for src in snap["sources"]:
        exec(compile(src, f"<course snapshot of {snap['name']}>", "exec"), ns)
    return snap["name"]
