"""What a trial checkpoint costs in each kind of `resources.storage`: the study folder (local disk) and an S3 URI.

A checkpoint is what `workers.ray.trainable._trainable` hands Tune: a temporary folder holding `torch.save` of the
trial's resumable state (model, AdamW moments, RNG), which Tune copies into the storage with pyarrow's
filesystems (`pyarrow.fs.copy_files`). This times that save + copy for PT's state at each `--widths`, to a local
folder and to an S3-compatible server on loopback (moto's, started here), `--repeats` times each, interleaved,
and prints the medians and the S3/local ratio measured in the same run. A loopback server measures the protocol's
overhead (requests, multipart upload), not a network.

    python benchmarks/bench_storage.py                         # widths 32, 128, 512; 9 repeats
    python benchmarks/bench_storage.py --widths 64 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(60):
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT"))
            return server, endpoint
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("moto's server did not start")


def _state(width: int) -> dict:
    """A PT trial's resumable state at `width` (the tiny catalog study's arch), after one AdamW step."""
    import torch

    from studies import load_catalog
    from studies.spec import TrialConfig
    from workers.models import build_model
    from workers.train import make_optimizer

    spec = load_catalog("tiny")
    trial = TrialConfig.model_validate(spec.trial_config(width, spec.space.defaults(), 0, 1))
    model = build_model(trial.model, vocab_size=spec.data.vocab_size, **trial.model_hp)
    opt = make_optimizer(model, trial)
    model.zero_grad()
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state()}


def _save_and_copy(state: dict, dest: str, fs) -> float:
    import pyarrow.fs as pafs
    import torch

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ptctl-ckpt-") as folder:
        torch.save(state, Path(folder) / "state.pt")
        fs.create_dir(dest)  # as Tune's upload does
        pafs.copy_files(folder, dest, destination_filesystem=fs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    import pyarrow.fs as pafs
    import torch

    torch.set_num_threads(1)
    server, endpoint = _moto()
    try:
        s3 = pafs.S3FileSystem(endpoint_override=endpoint, access_key="test", secret_key="test", region="us-east-1")
        local = pafs.LocalFileSystem()
        root = tempfile.mkdtemp(prefix="ptctl-storage-")
        print(f"load average {os.getloadavg()[0]:.2f}; {args.repeats} repeats, interleaved\n")
        print("| width | checkpoint MB | local (median s) | S3 on loopback (median s) | S3 / local |")
        print("|---|---|---|---|---|")
        for width in args.widths:
            state = _state(width)
            with tempfile.NamedTemporaryFile() as f:
                torch.save(state, f.name)
                size = Path(f.name).stat().st_size / 1e6
            times: dict[str, list[float]] = {"local": [], "s3": []}
            for i in range(args.repeats):
                times["local"].append(_save_and_copy(state, f"{root}/w{width}/c{i}", local))
                times["s3"].append(_save_and_copy(state, f"bench/w{width}/c{i}", s3))
            lo, hi = statistics.median(times["local"]), statistics.median(times["s3"])
            print(f"| {width} | {size:.2f} | {lo:.4f} | {hi:.4f} | {hi / lo:.1f} |")
    finally:
        os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
