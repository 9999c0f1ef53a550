"""How close `studies.members.member_bytes` (the door's and the batch sizer's training-memory arithmetic) comes to a
real PT training step's peak memory: the tiny study's PT at width 32, two AdamW steps per (seq_len, batch), each in a
fresh interpreter, the peak resident set above the model's build (getrusage) against the estimate.

    python benchmarks/bench_memory.py                     # the table recorded in docs/LOG.md
    python benchmarks/bench_memory.py --shapes 256x16     # one shape
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, torch
torch.set_num_threads(2)
from studies import load_catalog
from studies.members import member_bytes
from studies.spec import StudySpec
from workers.models import build_model
from workers.probe import random_batch
seq_len, batch = int(sys.argv[1]), int(sys.argv[2])
data = load_catalog("tiny").as_dict()
data["data"]["seq_len"], data["train"]["batch_size"] = seq_len, batch
spec = StudySpec.model_validate(data)
model = build_model("pt", vocab_size=spec.data.vocab_size, **spec.model_hp(32, {}))
opt = torch.optim.AdamW(model.parameters())
ids = random_batch(spec, torch.Generator().manual_seed(0))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(2):
    loss, _ = model.loss(ids)
    loss.backward()
    opt.step()
    opt.zero_grad()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"measured": (peak - base) * 1024, "estimate": member_bytes(spec, 32)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["256x16", "512x16", "1024x4", "2048x1"])
    args = parser.parse_args()
    print("| seq_len × batch | measured peak (GiB) | member_bytes (GiB) | estimate / measured |")
    print("|---|---|---|---|")
    for shape in args.shapes:
        seq_len, batch = shape.split("x")
        done = subprocess.run([sys.executable, "-c", CHILD, seq_len, batch], capture_output=True, text=True, check=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        m, e = got["measured"] / 2**30, got["estimate"] / 2**30
        print(f"| {seq_len} × {batch} | {m:.2f} | {e:.2f} | {e / m:.2f} |")


if __name__ == "__main__":
    main()
