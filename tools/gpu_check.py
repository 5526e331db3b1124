"""The course's CUDA/NCCL path on a GPU machine, in one run (issue 20's device check).

CI has no GPU, so this is run by hand where one is: it prints what it saw and writes the
executed notebooks and a JSON summary to ``--out``. What it runs:

* units 0, 3, 7 and 9 (their solutions, as in this checkout) on a local cluster of two engines
  sharing the GPU over gloo with CUDA tensors (``COURSE_TORCH_DEVICE=cuda``), and units 3 and 9
  on one engine, so ``cu.start_torch()`` chooses NCCL (one rank, one GPU: the lessons' checks
  that need two ranks fail there, as they do on one CPU rank; the summary lists them apart, as
  ``expected_on_one_rank``). The TensorFlow parts (unit 7's
  parameter-server section, unit 9's part B) are left out. Before each teardown one cell prints
  what ``cu.start_torch()`` reports (backend and device);
* ``course_utils.torch_dist.ddp_script`` under ``torchrun``: one rank on NCCL, and two ranks
  sharing the GPU over gloo with CUDA tensors (:func:`gloo_cuda_job`; NCCL refuses two ranks on
  one GPU);
* NCCL with two ranks on the one GPU, to record what NCCL says;
* unit 6's graduation script (the solution cell of ``06_two_hosts``) under ``torchrun`` on one
  GPU, twice: the second run resumes from the first one's checkpoint.

    python tools/gpu_check.py --out /tmp/gpu      # needs torch with CUDA, ipyparallel, nbclient
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("00_cluster_tour", "03_pytorch_ddp", "07_performance", "09_capstone")
#: Sections that need TensorFlow, from their heading to the next ``## `` heading.
TF_SECTIONS = ("## Parameter servers", "## Part B", "## Exercise 4 (optional)")
#: Checks that compare ranks and so fail on one rank, as they do on one CPU rank (the run of
#: ``COURSE_ENGINES=1`` here): unit 3's sampler epochs and its ``no_sync`` spread.
NEEDS_TWO_RANKS = ("which items rank 0 gets in epochs", "the gradients' spread inside no_sync")
#: Lines of the lessons' output the summary keeps (figures worth reading on a GPU).
SHOWN = ("resumed at epoch", "test accuracy by epoch")
PROBE = 'import course_utils as cu\nprint("GPU-CHECK", cu.start_torch())'


def lesson_cells(nb: dict) -> list[dict]:
    """The notebook's cells without its TensorFlow sections, with the probe before Teardown."""
    import nbformat

    kept, skipping = [], False
    for cell in nb["cells"]:
        head = cell["source"].lstrip() if cell["cell_type"] == "markdown" else ""
        if head.startswith("## "):
            skipping = head.startswith(TF_SECTIONS)
            if head.startswith("## Teardown"):
                kept.append(nbformat.v4.new_code_cell(PROBE))
        if not skipping:
            kept.append(cell)
    return kept


def split_one_rank(errors: list[str], tag: str) -> tuple[list[str], list[str]]:
    """(real errors, errors of checks that need two ranks) for a run on one rank; else
    (errors, [])."""
    if not tag.endswith("1-rank"):
        return errors, []
    one = [e for e in errors if any(k in e for k in NEEDS_TWO_RANKS)]
    return [e for e in errors if e not in one], one


def run_notebook(name: str, out: Path, tag: str) -> dict:
    """Execute one notebook (its kernel inherits this process's settings); errors are kept."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    nb.cells = lesson_cells(nb)
    t0 = time.perf_counter()
    work = out / f"work-{tag}"  # its own data/ and saved_models/: runs go side by side
    work.mkdir(exist_ok=True)
    client = NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=True,
                            resources={"metadata": {"path": str(work)}})
    try:
        client.execute()
    except Exception as exc:  # a dead kernel or a timeout: keep what ran
        errors = [f"{type(exc).__name__}: {exc}"[:600]]
    else:
        errors = []
    nbformat.write(nb, out / f"{name}-{tag}.ipynb")
    probe, said = "", []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                errors.append(f"cell {i}: {o['ename']}: {o['evalue']}"[:600])
            text = o.get("text", "") or o.get("data", {}).get("text/plain", "")
            if "GPU-CHECK" in text:
                probe = text.strip()[-600:]
            said += [line for line in text.splitlines() if any(k in line for k in SHOWN)]
    errors, one_rank = split_one_rank(errors, tag)
    return {"notebook": name, "run": tag, "expected_on_one_rank": one_rank,
            "seconds": round(time.perf_counter() - t0, 1),
            "code_cells": sum(c.cell_type == "code" for c in nb.cells), "errors": errors,
            "probe": probe, "said": said}


def sh(label: str, cmd: list[str], timeout: float = 240, env: dict | None = None,
       quiet: bool = False) -> dict:
    """Run a command, print its output under ``label``, return rc, seconds and JSON lines."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
    seconds = round(time.perf_counter() - t0, 1)
    if not quiet:
        print(f"\n### {label}: rc={rc} in {seconds} s\n$ {' '.join(cmd)}\n{text[-3000:]}",
              flush=True)
    lines = []
    for s in text.splitlines():
        if s.startswith("{") and s.endswith("}"):
            try:
                lines.append(json.loads(s))
            except ValueError:
                pass
    return {"label": label, "rc": rc, "seconds": seconds, "json": lines, "tail": text[-1500:]}


def notebook_job(name: str, tag: str, engines: int, out: Path) -> dict:
    """Run :func:`run_notebook` in a child process with a cluster of its own."""
    import torch

    env = {"COURSE_ENGINES": str(engines), "COURSE_CLUSTER_ID": f"gpu-{name[:2]}-{tag}",
           "COURSE_TORCH_DEVICE": "cuda" if torch.cuda.is_available() and engines > 1 else "cpu"}
    res = sh(f"{name} ({tag})", [sys.executable, str(Path(__file__)), "--out", str(out),
                                 "--notebook-job", name, tag], timeout=420, env=env, quiet=True)
    for line in res["json"]:
        if line.get("notebook") == name:
            return line
    return {"notebook": name, "run": tag, "errors": [f"runner rc={res['rc']}"], "tail": res["tail"]}


def nccl_shared_job() -> None:
    """Under torchrun: two ranks put an NCCL group on the same GPU, to see what NCCL says."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=30))
    t = torch.ones(1, device="cuda")
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print(json.dumps({"rank": dist.get_rank(), "all_reduce": t.item()}), flush=True)
    except Exception as exc:
        print(json.dumps({"rank": dist.get_rank(), "error": str(exc)[:400]}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def gloo_cuda_job() -> None:
    """Under torchrun: unit 3's DDP loop on a gloo group with every tensor on ``cuda:0``."""
    import datetime

    import torch
    import torch.distributed as dist

    from course_utils.torch_dist import ddp_script

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    res = ddp_script.train_steps(20, device=torch.device("cuda", 0))
    res.pop("model")
    dist.barrier()
    ddp_script.emit({**res, "backend": "gloo", "device": "cuda:0"})
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def graduation_script(out: Path) -> Path:
    """Unit 6's ``%%writefile train_ddp.py`` cell (the solution), written under ``out``."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "06_two_hosts.ipynb", as_version=4)
    src = next(c.source for c in nb.cells if c.source.startswith("%%writefile train_ddp.py"))
    path = out / "train_ddp.py"
    path.write_text(src.split("\n", 1)[1])
    return path


def scripts(out: Path) -> list[dict]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    mod = ["-m", "course_utils.torch_dist.ddp_script", "--steps", "20"]
    grad = graduation_script(out)
    ckpt = str(out / "ckpt" / "train_ddp.pt")
    return [
        sh("ddp_script, 1 rank, nccl", torchrun + ["--nproc-per-node=1", *mod, "--backend",
                                                   "nccl"]),
        sh("ddp_script loop, 2 ranks, gloo, CUDA tensors",
           torchrun + ["--nproc-per-node=2", str(Path(__file__)), "--gloo-cuda-job"]),
        sh("nccl, 2 ranks on one GPU", torchrun + ["--nproc-per-node=2", str(Path(__file__)),
                                                   "--nccl-shared-job"], timeout=120),
        sh("graduation script, 1 rank, first run", torchrun + ["--nproc-per-node=1", str(grad),
                                                               "--steps", "10", "--checkpoint",
                                                               ckpt]),
        sh("graduation script, 1 rank, resumed", torchrun + ["--nproc-per-node=1", str(grad),
                                                             "--steps", "20", "--checkpoint",
                                                             ckpt]),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_check_out")
    p.add_argument("--notebooks", nargs="*", default=list(NOTEBOOKS))
    p.add_argument("--no-scripts", action="store_true", help="notebooks only")
    p.add_argument("--gloo-cuda-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nccl-shared-job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--notebook-job", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.gloo_cuda_job:
        gloo_cuda_job()
    if args.nccl_shared_job:
        nccl_shared_job()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.notebook_job:
        name, tag = args.notebook_job
        print(json.dumps(run_notebook(name, out, tag)), flush=True)
        return 0
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    import torch

    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", flush=True)
    summary: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    jobs = [(n, "gloo-2-ranks", 2) for n in args.notebooks]
    jobs += [(n, "nccl-1-rank", 1) for n in args.notebooks if n[:2] in ("03", "09")]
    with cf.ThreadPoolExecutor(4) as pool:  # scripts and notebooks side by side
        later = pool.submit(lambda: [] if args.no_scripts else scripts(out))
        runs = [pool.submit(notebook_job, *job, out) for job in jobs]
        summary["notebooks"] = []
        for run in runs:
            res = run.result()
            print("\n###", json.dumps(res, indent=1), flush=True)
            summary["notebooks"].append(res)
        summary["scripts"] = later.result()
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    bad = [f'{n["notebook"]} ({n["run"]})' for n in summary["notebooks"] if n["errors"]]
    bad += [s["label"] for s in summary["scripts"] if s["rc"] != 0]
    print("\nFAILED:" if bad else "\nALL PASSED", *bad, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
