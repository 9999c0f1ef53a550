"""The API's model check in a child process (`workers.door.Door`): it answers the contract's verdicts as the check
in process does, holds no more memory than its cap (a refusal in the user's words, not a dead API), stops a check
past its time limit and starts a fresh child for the next, answers a shape it has seen without asking again, and
hands the child only the environment it is given (the API: not its tokens)."""

from __future__ import annotations

import copy
import os

import pytest

from studies import load_catalog
from studies.spec import StudySpec
from workers.door import Door

TINY = load_catalog("tiny").as_dict()
pytestmark = pytest.mark.slow  # each Door starts an interpreter that imports torch: seconds


def _spec(**arch) -> StudySpec:
    data = copy.deepcopy(TINY)
    data["model"]["arch"].update(arch)
    return StudySpec.model_validate(data)


def test_a_valid_model_passes_and_its_answer_is_kept():
    door = Door(2 * 2**30, 120)
    try:
        assert door.check(_spec()) is None
        child = door._child
        assert door.check(_spec()) is None and door._child is child  # the same process: it stayed up
        assert len(door._answers) == 1
    finally:
        door.close()


def test_a_model_over_the_memory_cap_is_refused_in_words_and_the_child_lives_on():
    door = Door(2**20, 120)  # 1 MiB beyond the imports; the model's U and V at rank 4096: 19 MB, mapped anew
    try:
        refused = door.check(_spec(rank=4096, gamma=8))
        assert refused is not None and refused.kind == "memory", refused
        assert "needed more than 1 MiB (PTCTL_DOOR_MEMORY_MB)" in refused.message, refused
        assert door._child is not None and door._child.poll() is None
        door.memory_bytes = 2 * 2**30  # the same model under the API's cap, in a fresh child
        door.close()
        assert door.check(_spec(rank=4096, gamma=7)) is None
    finally:
        door.close()


def test_a_check_past_its_time_limit_is_killed_and_the_next_check_starts_a_new_child():
    door = Door(2 * 2**30, 1e-3)
    try:
        refused = door.check(_spec())
        assert refused is not None and refused.kind == "time" and "PTCTL_DOOR_TIMEOUT_S" in refused.message
        assert door._child is None and not door._answers  # a timeout is not the spec's answer: not kept
        door.timeout_s = 120
        assert door.check(_spec()) is None
    finally:
        door.close()


def test_the_child_gets_the_environment_it_is_given():
    door = Door(2 * 2**30, 120, {k: v for k, v in os.environ.items() if k != "PTCTL_SECRET_PROBE"})
    os.environ["PTCTL_SECRET_PROBE"] = "s3cr3t"
    try:
        assert door.check(_spec()) is None
        with open(f"/proc/{door._child.pid}/environ", "rb") as environ:
            assert b"s3cr3t" not in environ.read()
    finally:
        os.environ.pop("PTCTL_SECRET_PROBE")
        door.close()
