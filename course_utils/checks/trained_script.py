"""Unit 6's script judged by what it trained, not only by what its ranks say about each other.

Introduced in ``06_two_hosts``: :func:`trained_problems` loads the checkpoint the learner's
``train_ddp.py`` saved and compares its weights, and the loss its ranks reported last, with
the same training done here in one process: ``make_model()`` and ``batch_of(step, rank)`` from
the script, SGD with the exercise's settings, and at every step the mean of every rank's loss
(what DDP's averaged gradients amount to). Runs in the kernel after the script has run; imports
torch only when called.
"""

from __future__ import annotations

import os
from typing import Any

from .graduation import load_script

#: The optimizer the exercise names: SGD, lr 0.1, momentum 0.9.
LR, MOMENTUM = 0.1, 0.9
#: Largest weight difference allowed: DDP's bucketed averaging and this process's mean of the
#: losses round differently (about 1e-7 after 8 steps); a step missed or doubled moves 1e-2.
TOLERANCE = 1e-4


def reference(script: Any, world: int, steps: int) -> tuple[dict[str, Any], float]:
    """The weights after ``steps`` steps of the exercise's training on ``world`` ranks, and
    the mean loss of the last step (what the ranks report, reduced)."""
    import torch
    import torch.nn.functional as F

    model = script.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    last = float("nan")
    for step in range(steps):
        opt.zero_grad()
        losses = [F.cross_entropy(model(x), y) for x, y in
                  (script.batch_of(step, r) for r in range(world))]
        loss = torch.stack(losses).mean()
        loss.backward()
        opt.step()
        last = float(loss)
    return model.state_dict(), last


def trained_problems(script_path: str | os.PathLike[str], checkpoint: str | os.PathLike[str],
                     world: int, steps: int, reported_loss: float | None) -> list[str]:
    """What the saved weights and the reported loss show wrong against :func:`reference`."""
    import torch

    if not os.path.exists(checkpoint):
        return [f"no checkpoint at {checkpoint}: rank 0 saves it after the last step"]
    script = load_script(script_path)
    want, want_loss = reference(script, world, steps)
    got = torch.load(checkpoint, map_location="cpu", weights_only=True).get("model", {})
    if sorted(got) != sorted(want):
        return [f"the checkpoint's model has the keys {sorted(got)}, expected {sorted(want)}: "
                "save model.state_dict() (the model DDP wraps)"]
    diff = max(float((got[k].float() - want[k].float()).abs().max()) for k in want)
    problems = []
    if diff > TOLERANCE:
        problems.append(
            f"after {steps} steps (4, then 4 more resumed) the saved weights are {diff:.3g} "
            f"away from {steps} steps of SGD (lr {LR}, momentum {MOMENTUM}) on every rank's "
            "batch_of(step, rank), averaged over the ranks: every step from `start` to "
            "args.steps must run opt.zero_grad(), loss.backward() through the DDP model and "
            "opt.step(), on the batch of that step")
    if reported_loss is None or abs(reported_loss - want_loss) > 1e-4:
        problems.append(
            f"the ranks reported loss {reported_loss} for the last step; the mean over all "
            f"ranks' samples is {want_loss:.6f}: report reduce_metrics(loss.item() * len(y), "
            "correct, len(y), device) of that step's batch")
    return problems
