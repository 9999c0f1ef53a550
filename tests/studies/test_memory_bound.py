"""The door's memory arithmetic (`studies.members.memory_problem`): a study whose largest trial cannot fit the memory
its trials get is refused naming the field that dominates, before anything is built; one that fits, one whose
trials train on a GPU (memory not known at the door) and one of a family without counts pass."""

from __future__ import annotations

import copy

from studies import load_catalog
from studies.members import member_bytes, memory_problem
from studies.spec import StudySpec

TINY = load_catalog("tiny").as_dict()
GIB = 2.0**30


def _spec(seq_len: int = 32, batch: int = 16, device: str = "cpu", widths: list[int] | None = None) -> StudySpec:
    data = copy.deepcopy(TINY)
    data["data"]["seq_len"], data["train"]["batch_size"], data["train"]["device"] = seq_len, batch, device
    if widths is not None:
        data["transfer"]["widths"] = widths
    return StudySpec.model_validate(data)


def test_a_long_context_that_cannot_fit_names_data_seq_len_with_the_need_and_the_memory():
    field, msg = memory_problem(_spec(8192, 16), 23 * GIB, "this machine", gpu=False)
    assert field == "data.seq_len" and msg.startswith("data.seq_len=8192: a trial at width 32 on 16 sequences"), msg
    assert "needs about 101.4 GiB" in msg and "this machine has 23.0 GiB" in msg and "lower data.seq_len" in msg


def test_the_same_context_on_one_sequence_fits_and_the_bound_is_the_estimate_itself():
    spec = _spec(8192, 1)
    assert memory_problem(spec, 23 * GIB, "this machine", gpu=False) is None
    need = member_bytes(spec, 32, 1)
    assert memory_problem(spec, need, "x", gpu=False) is None
    assert memory_problem(spec, need * 0.99, "x", gpu=False) is not None  # the boundary is the estimate


def test_wide_weights_name_the_widest_width():
    field, msg = memory_problem(_spec(32, 1, widths=[32, 8192]), 1 * GIB, "the Ray cluster's largest node", False)
    assert field == "transfer.widths[1]" and msg.startswith("transfer.widths[1]=8192: a trial at width 8192"), msg
    assert "the Ray cluster's largest node has 1.0 GiB" in msg


def test_gpu_trials_are_not_judged_by_host_memory():
    assert memory_problem(_spec(65536, 16, device="cuda"), GIB, "x", gpu=False) is None
    assert memory_problem(_spec(65536, 16, device="auto"), GIB, "x", gpu=True) is None
    assert memory_problem(_spec(65536, 16, device="auto"), GIB, "x", gpu=False) is not None
