"""PT's GPU-facing code paths, checked on a CPU-only machine.

- `bench_pt.py --device cuda` without a GPU stops at once with one line naming the fix.
- dtype handling: float64 / bfloat16 models keep their dtype end to end; gradients land in the
  parameters' dtype.
- autocast (bf16, what a GPU run would use): the recompute path's hand-written backward works
  under it and stays within a stated bound of float32; the stored path refuses it clearly.
- torch.compile: the custom autograd Functions trace (aot_eager backend, no C++ toolchain needed)
  and the compiled step matches eager.
- pinned memory: a batch bound for CUDA is pinned and copied with non_blocking; one for the CPU is not copied.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from workers.models import build_model
from workers.models.common import token_loss

HP = {"vocab_size": 50, "width": 32, "base_width": 32, "n_channels": 4, "rank": 8, "gamma": 2,
      "topic": "single_split", "n_topics": 4}
BF16_LOGITS_TOL = 2e-2  # relative L2 error of bf16-autocast logits against float32 (measured ≈ 4e-3)
BF16_GRAD_TOL = 5e-2  # relative L2 error of each parameter gradient (measured ≤ 7.5e-3)


def load_bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_pt.py"
    spec = importlib.util.spec_from_file_location("bench_pt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (3, 20), generator=g)
    mask = torch.ones(3, 20, dtype=torch.bool)
    mask[1, 15:] = False
    return ids, mask


def grads_of(model, ids, mask, autocast: bool = False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids, mask)
    token_loss(logits.float(), ids.masked_fill(~mask, -100)).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_cuda_without_gpu_fails_with_one_clear_line(capsys):
    bench = load_bench()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cuda", "--configs", "small"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--device cuda: no CUDA device is visible" in err and "--device cpu" in err
    assert bench.device_error("cpu", False) is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_model_keeps_its_dtype(dtype):
    torch.manual_seed(0)
    model = build_model("pt", **HP).to(dtype).train()
    ids, mask = batch()
    logits, grads = grads_of(model, ids, mask)
    assert logits.dtype == dtype
    assert grads and all(g.dtype == dtype and torch.isfinite(g).all() for g in grads.values())


def test_bf16_autocast_within_bound_of_float32():
    torch.manual_seed(0)
    model = build_model("pt", **HP).train()
    ids, mask = batch()
    ref_logits, ref_grads = grads_of(model, ids, mask)
    logits, grads = grads_of(model, ids, mask, autocast=True)
    assert logits.dtype == torch.bfloat16  # the autocast path really ran in bf16
    assert rel(logits, ref_logits) <= BF16_LOGITS_TOL
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        assert g.dtype == torch.float32, name  # master weights stay float32
        assert rel(g, ref_grads[name]) <= BF16_GRAD_TOL, name


def test_stored_path_refuses_autocast_clearly():
    model = build_model("pt", **HP, recompute=False)
    ids, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="set recompute: true"):
        model(ids, mask)


@pytest.mark.slow  # torch.compile: 7 s, most of it the compiler
def test_compiled_step_matches_eager():
    # asked here, not in a skipif: `torch._dynamo` takes 0.9 s to import, and every pytest worker collects this module
    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile unsupported here")
    ids, mask = batch()
    torch.manual_seed(0)
    compiled = build_model("pt", **HP).train()  # compiled before it ever runs eagerly: nothing cached yet
    torch._dynamo.reset()
    logits, grads = grads_of(torch.compile(compiled, backend="aot_eager"), ids, mask)
    torch.manual_seed(0)
    ref_logits, ref_grads = grads_of(build_model("pt", **HP).train(), ids, mask)
    assert rel(logits, ref_logits) <= 1e-6
    for name, g in grads.items():
        assert rel(g, ref_grads[name.removeprefix("_orig_mod.")]) <= 1e-5, name


def test_batches_reach_a_gpu_through_pinned_memory(monkeypatch):
    """A batch bound for CUDA is pinned and copied asynchronously (what DataLoader's pin_memory does); one for
    the CPU is left where it is. CUDA is faked at the tensor level: the decision is ours, not torch's."""
    from workers.batches import Batch

    calls: list[tuple[str, object]] = []
    real_to = torch.Tensor.to

    def pin(t):
        calls.append(("pin", None))
        return t

    def to(t, device, non_blocking=False):
        calls.append(("to", (str(device), non_blocking)))
        return real_to(t, "cpu")

    cpu = Batch(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3).bool())
    assert cpu.to("cpu").input_ids is cpu.input_ids  # no copy on the CPU
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    cpu.to(torch.device("cuda", 0))
    assert calls == [("pin", None), ("to", ("cuda:0", True))] * 3
    calls.clear()
    cpu.to("cpu")
    assert calls == [("to", ("cpu", False))] * 3
