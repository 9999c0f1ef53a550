"""`resources.batch_members: auto` on a Ray cluster with GPUs: a grid phase's batches are sized by the memory of
the workers' GPUs (`workers.ray.cluster.worker_gpu_memory`), asked of each GPU node by a task that holds a trial's
share of a GPU there, and never hold more members than that share of memory fits (`studies.members`).

The cluster is a private Ray declaring one GPU (`ray.init(num_gpus=1)`) in a child process: this machine has no CUDA
device, so the real probe answers None; a probe that reports 4 GiB stands in for a GPU's answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studies.members import MEMORY_SHARE

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, os, ray
from studies import load_catalog
from studies.cost import planned_trials
from studies.members import member_bytes
from workers.ray import cluster, experiment

ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
spec = load_catalog("cpu_demo")
spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"transfer_gpus": 0.5})})
planned = planned_trials(spec)["verify"]

def sizes():
    return sorted((len(t["members"]) if "members" in t else 1 for t in experiment._grid(spec, "verify", planned)),
                  reverse=True)

out = {"no_cuda": cluster.worker_gpu_memory(0.5), "sizes_no_cuda": sizes()}

@ray.remote(num_cpus=0)
def four_gib():  # what a 4 GiB GPU's worker reports: only where the task was given a GPU
    return 4 * 2**30 if os.environ.get("CUDA_VISIBLE_DEVICES") == "0" else None

cluster._device_memory = four_gib
out |= {"half": cluster.worker_gpu_memory(0.5), "two": cluster.worker_gpu_memory(2.0),
        "sizes_4gib": sizes(), "member_bytes": member_bytes(spec, 64), "planned": len(planned)}
print(json.dumps(out))
"""


def child_json(code: str, data_dir: Path) -> dict:
    """Run `code` (which starts a private Ray) in a child process with `data_dir` as its PTCTL_DATA_DIR; the JSON
    of its last line of output."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PTCTL_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a private Ray in a child process: ≈ 9 s
def test_auto_batches_on_gpus_fit_the_memory_the_gpu_workers_report(tmp_path):
    out = child_json(CHILD, tmp_path)
    # no CUDA device answers: sized by the slots alone (1 GPU / 0.5 per trial = 2 slots: 62 trials → at most 31)
    assert out["no_cuda"] is None
    assert out["sizes_no_cuda"][0] == 30  # the 59 samples (one seed) as 30 + 29; the centre's seeds alone
    # a trial of half a GPU holds half its memory; a trial of two GPUs trains a batch on one of them
    assert out["half"] == 2 * 2**30 and out["two"] == 4 * 2**30
    fits = int(MEMORY_SHARE * out["half"] // out["member_bytes"])  # of the trial's share of the GPU
    assert 1 < fits < 30
    assert out["sizes_4gib"][0] == fits and sum(out["sizes_4gib"]) == out["planned"]
