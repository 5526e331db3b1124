"""Helpers a graded test calls, checked before the test runs: a submission must not swap them.

A graded test cell calls the course's helpers from the student's own kernel (``cluster.run``,
``cluster.call``, ``checks.engine_check_collectives``...) and the engines. A cell the student
wrote just before it could replace one, say ``cluster.call = lambda name, *a, **k: [5.0] * p``,
and a wrong answer would pass. Before each graded test, the grader
(:class:`.nbgrader_setup.CourseExecute`) runs :func:`probe_code` in the kernel: it looks, in the
kernel and on every engine, for a course helper whose code was written in the notebook:

* an attribute of a ``course_utils`` module or class, or of ``builtins``, that is a function
  compiled from a notebook cell (IPython names those files ``<ipython-input-...>`` or
  ``.../ipykernel_<pid>/<hash>.py``; ``%%px`` code on an engine too);
* an attribute set on a course object in the notebook's namespace that hides a method of its
  class (``cluster.call = ...``).

What it finds is recorded on the test cell, the test does not run and scores 0, and
``course grade`` notes it like an edited or deleted test. The probe's code is sent as text and
runs in a namespace of its own, so replacing this module in the kernel does not change it. It
finds the usual swaps, not every conceivable one: code in the student's process can in the end
change anything there, which is why ``course grade`` also runs each notebook on its own cluster.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from typing import Any

#: The error a test cell shows when helpers were replaced before it (nbgrader scores it 0).
ENAME = "ReplacedHelper"
#: The line the probe prints, then its findings as JSON.
MARK = "COURSE-INTEGRITY "


def replaced_helpers(namespace: dict[str, Any] | None = None) -> list[str]:
    """Course helpers (and builtins) in this process whose code comes from a notebook cell,
    and course objects in ``namespace`` with a method hidden by an attribute. Self-contained:
    it is sent to kernels and engines as source text."""
    import builtins
    import sys

    def from_a_cell(value: Any) -> bool:
        fn = getattr(value, "__func__", value)
        code = getattr(fn, "__code__", None)
        name = getattr(code, "co_filename", "")
        return code is not None and (name.startswith("<ipython-input") or "/ipykernel_" in name)

    found = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == "course_utils"
                                  or mod_name.startswith("course_utils.")):
            continue
        for attr, value in list(vars(module).items()):
            if from_a_cell(value):
                found.append(f"{mod_name}.{attr}")
            elif isinstance(value, type) and value.__module__ == mod_name:
                found += [f"{mod_name}.{attr}.{a}" for a, v in list(vars(value).items())
                          if from_a_cell(v)]
    found += [f"builtins.{a}" for a, v in list(vars(builtins).items()) if from_a_cell(v)]
    for var, obj in list((namespace or {}).items()):
        cls = type(obj)
        if var.startswith("_") or not str(getattr(cls, "__module__", "")).startswith(
                "course_utils") or not hasattr(obj, "__dict__"):
            continue
        found += [f"{var}.{a}" for a, v in list(vars(obj).items())
                  if callable(v) and (callable(getattr(cls, a, None)) or from_a_cell(v))]
    return sorted(set(found))


def probe_code(engine_timeout: float = 20.0) -> str:
    """The code the grader runs in the kernel before a graded test: :func:`replaced_helpers`
    in the kernel, then on every engine of the course cluster if one is running; prints
    :data:`MARK` and the findings as JSON. Defines nothing in the notebook's namespace."""
    source = "from __future__ import annotations\n" + textwrap.dedent(
        inspect.getsource(replaced_helpers))
    return textwrap.dedent(f"""\
        def _course_integrity_probe():
            import json, sys
            scope = {{}}
            exec(compile({source!r}, "<course-integrity>", "exec"), scope)
            scan = scope["replaced_helpers"]
            shell = sys.modules["IPython"].get_ipython()
            found = ["kernel: " + f for f in scan(dict(shell.user_ns))]
            registry = sys.modules.get("course_utils.cluster.kernel.registry")
            cc = registry.current_or_none() if registry else None
            engines = "no cluster"
            if cc is not None:
                try:
                    view = cc.client[cc.ranks.engine_ids]
                    per_rank = view.apply_async(scan).get(timeout={engine_timeout!r})
                    found += [f"rank {{r}}: {{f}}" for r, fs in enumerate(per_rank) for f in fs]
                    engines = "checked"
                except Exception as exc:
                    engines = "not checked: " + type(exc).__name__
            print({MARK!r} + json.dumps({{"found": found, "engines": engines}}))
        _course_integrity_probe()
        del _course_integrity_probe
        """)


def read_probe(outputs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The probe's findings from its cell outputs, or None when it printed none."""
    for out in outputs:
        for line in str(out.get("text", "")).splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
    return None


_SAID = "so it was not run (0 points): "


def message(found: list[str]) -> str:
    """The test cell's error text when helpers were replaced."""
    return f"the notebook replaced course helpers before this test, {_SAID}{', '.join(found)}"


def replaced_in(outputs: list[dict[str, Any]]) -> list[str]:
    """What :func:`message` listed, read back from a graded cell's outputs (empty: nothing)."""
    for out in outputs:
        if out.get("ename") == ENAME and _SAID in str(out.get("evalue", "")):
            return str(out["evalue"]).split(_SAID, 1)[1].split(", ")
    return []
