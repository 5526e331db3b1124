"""Kernel-side checks behind part B of ``09_capstone``: the parameter-server run (TensorFlow's
``ParameterServerStrategy``, this kernel the coordinator) scored on the held-out split, and its
start and resume checked by calling the learner's ``train_ps`` again, cheaply."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from .capstone import TARGET
from .feedback_format import feedback


def check_tf_capstone(model: Any, data_root: str = "data", n_test: int = 1000,
                      batch: int = 250) -> dict[str, Any]:
    """*In the kernel* (part B of ``09_capstone``). Score the learner's TensorFlow model (a
    callable from a float32 batch (N, 32, 32, 3) to logits) on the same held-out test split as
    :func:`engine_check_capstone`, and say whether every variable of it lives on a ps task
    (created under ``strategy.scope()``). Returns accuracy, dataset name, target, ``n``,
    ``on_ps`` and the variables' ``devices``."""
    import numpy as np

    from ..data import cifar10
    from ..tf_dist.models import nhwc

    test = cifar10(data_root, train=False, n=n_test, download=False)
    x = nhwc(test.x)
    preds = [np.argmax(np.asarray(model(x[i:i + batch])), 1) for i in range(0, len(x), batch)]
    acc = float(np.mean(np.concatenate(preds) == test.y))
    variables = list(getattr(model, "trainable_variables", ()))
    devices = sorted({str(getattr(v, "device", "")) for v in variables})
    return {"accuracy": acc, "data": test.name, "target": TARGET.get(test.name, 0.0),
            "n": len(test.y), "devices": devices,
            "on_ps": bool(devices) and all("/job:ps/" in d for d in devices)}


def tf_start_and_resume_problem(train_ps: Callable[..., list], history: list[dict],
                                ckpt_dir: str, probe: Any) -> str | None:
    """What is wrong with how ``train_ps(epochs, ckpt_dir, budget_s)`` starts and resumes, as
    a checked/expected/found/try message, else ``None``. ``history`` is what its full run into
    ``ckpt_dir`` returned; ``probe`` a float32 batch (N, 32, 32, 3) to compare outputs on.

    1. The latest checkpoint holds ``epoch`` = the number of epochs run.
    2. ``train_ps(0, <empty folder>, ...)``: nothing runs, and the global ``tf_model`` is
       ``tf_models.cnn(seed=0)`` as created (the same outputs).
    3. ``train_ps(len(history), ckpt_dir, 0)``: every epoch is done, so nothing runs, and the
       new ``tf_model`` gives the outputs of the trained one (restored from the checkpoint).
    """
    import numpy as np
    import tensorflow as tf

    import __main__

    from ..tf_dist.models import cnn

    n = len(history)
    latest = tf.train.latest_checkpoint(ckpt_dir)
    if not latest:
        return feedback(f"a checkpoint in {ckpt_dir}", "one, saved after every epoch",
                        "none", "manager.save() after each epoch's coordinator.join()")
    key = "epoch/.ATTRIBUTES/VARIABLE_VALUE"
    saved = (int(tf.train.load_variable(latest, key))
             if key in dict(tf.train.list_variables(latest)) else None)
    if saved != n:
        return feedback("the epoch counter in the latest checkpoint", f"{n} (epochs run)",
                        f"{saved} (None: no `epoch` in the checkpoint)",
                        "tf.train.Checkpoint(model=..., epoch=counter); counter.assign(epoch "
                        "+ 1) before manager.save()")
    trained = np.asarray(__main__.tf_model(probe))
    with tempfile.TemporaryDirectory() as empty:
        ran = train_ps(0, empty, 60)
    fresh = np.allclose(np.asarray(__main__.tf_model(probe)), np.asarray(cnn(seed=0)(probe)),
                        atol=1e-6)
    if ran or not fresh:
        return feedback("train_ps(0, <an empty folder>, 60): a fresh start with no epoch to run",
                        "no epoch, and tf_model = tf_models.cnn(seed=0) as created",
                        f"epochs {[h.get('epoch') for h in ran]}, tf_model as created: {fresh}",
                        "create tf_models.cnn(seed=0); loop range(counter, epochs)")
    again = train_ps(n, ckpt_dir, 0)
    restored = np.allclose(np.asarray(__main__.tf_model(probe)), trained, atol=1e-6)
    if again or not restored:
        return feedback(f"train_ps({n}, ckpt_dir, 0) after the run: every epoch already done",
                        "no epoch run, and tf_model restored to the trained weights",
                        f"epochs {[h.get('epoch') for h in again]}, restored: {restored}",
                        "restore manager.latest_checkpoint (model and counter) before the loop")
    return None
