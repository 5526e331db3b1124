"""Engine-side probes behind the graded tests of ``09_capstone``: held-out accuracy (on a split
the notebook never loads), equal weights on every rank, and resuming from a checkpoint."""

from __future__ import annotations

import os
from typing import Any

from .common import learner

#: The capstone's accuracy bar on held-out data, per dataset.
TARGET = {"digits-as-cifar": 0.85, "cifar10": 0.30}



def engine_check_capstone(model_name: str = "final_model", data_root: str = "data",
                          n_test: int = 1000) -> dict[str, Any]:
    """*Collective.* Score the learner's model (a plain module or a DDP wrapper) on the held-out
    test split (CIFAR-10's test set or the digits fallback's test split, whichever the course
    data resolves to; never loaded by the notebook), and measure how far the ranks' weights
    are apart. Returns the accuracy, the dataset's name and target, and the weight spread."""
    import torch

    from ..data import cifar10
    from ..torch_dist.train import evaluate, replica_spread

    model = learner(model_name)
    model = getattr(model, "module", model)
    test = cifar10(data_root, train=False, n=n_test, download=False)
    x = (torch.from_numpy(test.x) - 0.5) / 0.5
    y = torch.from_numpy(test.y)
    device = next(model.parameters()).device
    acc = evaluate(model, x.to(device), y.to(device))["accuracy"]
    return {"accuracy": acc, "data": test.name, "target": TARGET.get(test.name, 0.0),
            "spread": replica_spread(model), "n": len(y)}


def engine_check_resume(fn_name: str = "resume_or_start", folder: str = "/tmp"
                        ) -> dict[str, Any]:
    """*Collective.* Call the learner's ``fn_name(model, optimizer, path)`` twice on a fresh
    model: with no file (expect epoch 0, weights untouched) and with a checkpoint of epoch 5
    written by rank 0 (expect 5, the checkpoint's weights and momentum on every rank)."""
    import torch
    import torch.distributed as dist

    from ..torch_dist.train import flat_params, original_cnn

    fn = learner(fn_name)
    rank = dist.get_rank()
    path = os.path.join(folder, "capstone-resume-check.pt")
    if rank == 0 and os.path.exists(path):
        os.remove(path)
    dist.barrier()
    fresh = original_cnn(seed=7)
    before = flat_params(fresh).clone()
    none_epoch = fn(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9), path)
    untouched = bool(torch.equal(before, flat_params(fresh)))
    dist.barrier()   # every rank has looked for the file before rank 0 writes it
    saved = original_cnn(seed=11)
    opt = torch.optim.SGD(saved.parameters(), lr=0.1, momentum=0.9)
    saved(torch.zeros(2, 3, 32, 32)).sum().backward()
    opt.step()
    if rank == 0:
        torch.save({"model": saved.state_dict(), "optimizer": opt.state_dict(), "epoch": 5},
                   path)
    dist.barrier()
    model = original_cnn(seed=100 + rank)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    epoch = fn(model, opt2, path)
    diff = float((flat_params(model) - flat_params(saved)).abs().max())
    has_momentum = bool(opt2.state_dict()["state"])
    dist.barrier()
    return {"no_file_epoch": none_epoch, "untouched": untouched, "epoch": epoch,
            "weight_diff": diff, "momentum_restored": has_momentum}


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
