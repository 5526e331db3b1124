"""Unit 6's graduation checks and its figure, without a cluster: the learner's torchrun line
flag by flag, the device choice on a posed two-host rank map, what a run's JSON lines show
wrong, and the picture of what crosses the link (``course_utils.viz.hosts``).

The script itself runs for real under torchrun in the notebook (nbval) and across the two
simulated hosts in ``tests/test_two_hosts.py``.
"""

from __future__ import annotations

import json
import re

import pytest

from course_utils.assignments.lessons import NOTEBOOK_DIR, read
from course_utils.checks import graduation as g
from course_utils.cluster.launchers.slurm_script import torchrun_args
from course_utils.notebook_cells import nbgrader_meta
from course_utils.viz import hosts as vh

C10D = ("torchrun --nnodes 2 --nproc-per-node $NPROC_PER_NODE --rdzv-backend c10d "
        "--rdzv-endpoint $RDZV_ENDPOINT --rdzv-id u6 train_ddp.py")
STATIC = ("torchrun --nnodes=2 --nproc_per_node=$NPROC_PER_NODE --node-rank=$NODE_RANK "
          "--master-addr=$MASTER_ADDR --master-port=${MASTER_PORT} train_ddp.py --steps 3")


def notebook_solution(grade_id: str) -> str:
    cell = next(c for c in read(NOTEBOOK_DIR / "06_two_hosts.ipynb").cells
                if nbgrader_meta(c).get("grade_id") == grade_id)
    return cell.source


# ---- the torchrun line --------------------------------------------------------------------
@pytest.mark.parametrize("line", [C10D, STATIC, "python -m torch.distributed.run"
                                  + C10D.removeprefix("torchrun")])
def test_both_rendezvous_forms_pass(line):
    assert g.line_problems(line) == []


@pytest.mark.parametrize("line, fix", [
    (C10D.replace("--nnodes 2", "--nnodes 1"), "--nnodes 2 on every node"),
    (C10D.replace("--nnodes 2 ", ""), "--nnodes 2 on every node"),
    (C10D.replace("$NPROC_PER_NODE", "2"), "take it from $NPROC_PER_NODE"),
    (C10D.replace("$RDZV_ENDPOINT", "10.0.0.2:29400"), "$RDZV_ENDPOINT"),
    (C10D.replace("--rdzv-backend c10d", "--rdzv-backend etcd"), "--rdzv-backend c10d"),
    (STATIC.replace("$NODE_RANK", "0"), "a typed node rank would make every node node 0"),
    ("torchrun --standalone --nnodes 2 --nproc-per-node $NPROC_PER_NODE train_ddp.py",
     "--standalone makes a one-node job"),
    (C10D.replace("train_ddp.py", "-m course_utils.torch_dist.ddp_script"),
     "must run train_ddp.py"),
    ("python train_ddp.py", "must start with torchrun"),
    ("", "as a string"),
    ("torchrun 'unclosed", "not one shell command line"),
])
def test_wrong_lines_name_the_fix(line, fix):
    problems = g.line_problems(line)
    assert any(fix in p for p in problems), problems


def test_the_notebook_line_passes_and_node_env_follows_the_rank_map():
    ns: dict = {}
    exec(re.sub(r"### (BEGIN|END) SOLUTION\n", "", notebook_solution("ex4-solution")), ns)
    assert g.line_problems(ns["TORCHRUN_LINE"]) == []
    env = g.node_env(1, 2, "10.0.0.2", 29400, "10.0.0.3")
    assert env == {"NPROC_PER_NODE": "2", "NODE_RANK": "1", "NODE_ADDR": "10.0.0.3",
                   "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29400",
                   "RDZV_ENDPOINT": "10.0.0.2:29400", "IS_HOST": "0"}
    assert set(env) == set(g.LINE_VARIABLES)


def test_torchrun_args_runs_a_script_file_or_a_module():
    argv = torchrun_args(2, 1, "h:1", script="train_ddp.py", script_args=["--steps", "3"])
    assert argv[-3:] == ["train_ddp.py", "--steps", "3"] and "-m" not in argv
    assert torchrun_args(1, 2, "h:1")[-2:] == ["-m", "course_utils.torch_dist.ddp_script"]


# ---- the device, on ranks where local rank != rank -----------------------------------------
def test_posed_two_hosts_has_local_ranks_that_differ_from_ranks():
    rm = g.posed_two_hosts()
    assert [(r.rank, r.local_rank, r.node_rank) for r in rm] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert rm.master_addr == "10.0.0.2" and rm[3].as_env()["LOCAL_RANK"] == "1"


def test_device_for_by_local_rank_passes_and_by_rank_fails():
    torch = pytest.importorskip("torch")

    def by_local(env, cuda):
        return torch.device("cuda", int(env["LOCAL_RANK"])) if cuda else torch.device("cpu")

    def by_rank(env, cuda):
        return torch.device(f"cuda:{env['RANK']}") if cuda else torch.device("cpu")

    def always_gpu(env, cuda):
        return torch.device("cuda", int(env["LOCAL_RANK"]))

    assert g.device_problems(by_local) == []
    bad = g.device_problems(by_rank)
    assert len(bad) == 2 and "rank 2 on host-b (local rank 0)" in bad[0]
    assert "LOCAL_RANK, not RANK" in bad[0]
    assert all("expected cpu" in p for p in g.device_problems(always_gpu))

    def broken(env, cuda):
        raise KeyError("LOCAL_RANK")

    assert "KeyError" in g.device_problems(broken)[0]


# ---- what a run's lines show ---------------------------------------------------------------
def fake_run(lines, rcs=(0,)) -> g.ScriptRun:
    return g.ScriptRun(argvs=[["torchrun"]] * len(rcs), returncodes=list(rcs),
                       stdout=["\n".join(json.dumps(x) for x in lines) + "\nnot json {\n"],
                       stderr=["boom"] * len(rcs))


def good_lines(start=0, steps=4, world=2, savers=(0,)):
    return ([{"rank": r, "event": "start", "step": start, "local_rank": r, "world_size": world,
              "device": "cpu"} for r in range(world)]
            + [{"rank": r, "event": "saved", "step": steps} for r in savers]
            + [{"rank": r, "event": "done", "step": steps, "loss": 0.5} for r in range(world)])


def test_a_good_run_and_a_good_resume_pass():
    assert g.run_problems(fake_run(good_lines()), world=2, steps=4) == []
    assert g.run_problems(fake_run(good_lines(4, 8)), 2, 8, resumed_from=4) == []
    run = fake_run(good_lines())
    assert [x["rank"] for x in run.events("done")] == [0, 1] and run.ok
    assert "rank 0: loss 0.5000" in run.summary()


@pytest.mark.parametrize("run, kw, fix", [
    (fake_run(good_lines(savers=(0, 1))), {}, "save only on rank 0"),
    (fake_run(good_lines(savers=())), {}, "save only on rank 0"),
    (fake_run(good_lines(0, 8)), {"resumed_from": 4, "steps": 8}, "call load_checkpoint"),
    (fake_run([*good_lines()[:3], {"rank": 0, "event": "done", "loss": 0.5},
               {"rank": 1, "event": "done", "loss": 0.7}]), {}, "reduce the metrics"),
    (fake_run(good_lines()[:3]), {}, "a 'done' line from each of ranks 0..1"),
    (fake_run([{k: v for k, v in x.items() if k != "device"} for x in good_lines()]), {},
     "lack fields (rank, field): [(0, 'device'), (1, 'device')]"),
    (fake_run([{k: v for k, v in x.items() if k != "step" or x["event"] != "done"}
               for x in good_lines()]), {}, "lack fields (rank, field): [(0, 'step')"),
    (fake_run(good_lines(), rcs=(1,)), {}, "torchrun exited [1]"),
    (None, {}, "not run"),
])
def test_bad_runs_name_the_fix(run, kw, fix):
    problems = g.run_problems(run, world=2, **{"steps": 4, **kw})
    assert any(fix in p for p in problems), problems


def test_a_script_is_loaded_without_running_its_main(tmp_path):
    script = tmp_path / "train_ddp.py"
    script.write_text("def device_for(env, cuda):\n    return 'cpu'\n\n"
                      "if __name__ == '__main__':\n    raise SystemExit('ran main')\n")
    assert g.load_script(script).device_for({}, False) == "cpu"


# ---- the figure ----------------------------------------------------------------------------
def test_link_traffic_on_two_hosts_counts_what_crosses():
    ranks = g.posed_two_hosts().to_dicts()
    assert vh.crossing_counts(ranks) == {"store": (2, 3), "gloo": (4, 6), "control": (2, 4)}
    assert vh.hosts_in_order(ranks) == ["host-a", "host-b"]
    crossing = {(t["kind"], t["a"], t["b"]) for t in vh.link_traffic(ranks) if t["crosses"]}
    assert ("gloo", 1, 2) in crossing and ("gloo", 0, 1) not in crossing
    assert ("store", 2, 0) in crossing and ("control", "controller", 3) in crossing
    # The controller on the second host: its connections to host a's ranks cross instead.
    moved = vh.crossing_counts(ranks, controller_host="host-b")
    assert moved["control"] == (2, 4)
    assert {t["b"] for t in vh.link_traffic(ranks, "host-b")
            if t["kind"] == "control" and t["crosses"]} == {0, 1}


def test_one_host_crosses_nothing_and_no_ranks_is_an_error():
    one = [{"rank": r, "local_rank": r, "node_rank": 0, "host": "laptop"} for r in range(2)]
    assert all(not t["crosses"] for t in vh.link_traffic(one))
    with pytest.raises(ValueError, match="cluster.ranks.to_dicts"):
        vh.link_traffic([])


def test_hosts_picture_draws_every_rank_and_the_counts():
    pytest.importorskip("matplotlib")
    fig = vh.hosts_picture(g.posed_two_hosts().to_dicts())
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum("local rank" in t for t in texts) == 4
    assert any("rank 2\nlocal rank 0\nnode rank 1" in t for t in texts)
    assert any("gloo pair" in t and "4 of 6 cross the link" in t for t in texts)
    assert any(t.startswith("node rank 1: host-b") for t in texts)
    lines = [t for t in fig.axes[0].texts if type(t).__name__ == "Annotation"]
    assert len(lines) == 2 + 4 + 2  # store, gloo pairs, control: the crossing ones only
    import matplotlib.pyplot as plt

    plt.close(fig)
    one = vh.hosts_picture([{"rank": 0, "local_rank": 0, "node_rank": 0, "host": "x"}])
    assert not [t for t in one.axes[0].texts if type(t).__name__ == "Annotation"]
    plt.close(one)


def test_a_script_that_does_not_load_or_picks_by_rank_is_named_before_running(tmp_path):
    pytest.importorskip("torch")
    stub = tmp_path / "train_ddp.py"
    stub.write_text("import torch\n# YOUR CODE HERE\nraise NotImplementedError()\n")
    said = g.script_device_problems(stub)
    assert len(said) == 1 and "does not load (NotImplementedError" in said[0]
    stub.write_text("import torch\n\ndef device_for(env, cuda):\n"
                    "    return torch.device(f\"cuda:{env['RANK']}\") if cuda else 'cpu'\n")
    assert "LOCAL_RANK, not RANK" in g.script_device_problems(stub)[0]


# ---- the batch script's key lines ------------------------------------------------------------
LINES = ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
         'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node "$NPROC_PER_NODE" '
         '--rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID" '
         "train_ddp.py"]


def test_the_notebook_batch_lines_pass_and_make_one_checked_script():
    ns: dict = {}
    exec(re.sub(r"### (BEGIN|END) SOLUTION\n", "", notebook_solution("ex5-solution")), ns)
    assert g.batch_problems(ns["SBATCH_LINES"]) == [] and g.batch_problems(LINES) == []
    text = g.batch_script(LINES, script_args=["--steps", "3"])
    assert text.count("#SBATCH --nodes=") == 1 and "#SBATCH --nodes=2" in text
    assert 'export RDZV_ENDPOINT="$HEAD_NODE:$RDZV_PORT"' in text
    assert "export NPROC_PER_NODE=" in text and text.rstrip().endswith("train_ddp.py --steps 3")


@pytest.mark.parametrize("lines, fix", [
    ([LINES[0], "#SBATCH --ntasks-per-node=2", LINES[2]], "one task per node"),
    ([LINES[0], LINES[1], LINES[2].replace("srun", "srun --ntasks-per-node=2")],
     "srun must start one task per node"),
    (["#SBATCH --nodes=1", *LINES[1:]], "#SBATCH --nodes=2"),
    ([*LINES[:2], LINES[2].replace('"$SLURM_NNODES"', "1")], "use $SLURM_NNODES"),
    ([*LINES[:2], LINES[2].replace('"$NPROC_PER_NODE"', "4")], "$NPROC_PER_NODE"),
    ([*LINES[:2], LINES[2].replace("--rdzv-backend c10d ", "")], "--rdzv-backend c10d"),
    ([*LINES[:2], LINES[2].replace("srun torchrun", "srun python")], "must run torchrun"),
    (LINES[:2], "expected one srun line"),
    ("srun torchrun", "must be a list of strings"),
])
def test_wrong_batch_lines_name_the_fix(lines, fix):
    problems = g.batch_problems(lines)
    assert any(fix in p for p in problems), problems


def test_sbatch_test_only_is_none_without_sbatch(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert g.sbatch_test_only("#!/bin/bash\n") is None
