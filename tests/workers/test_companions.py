"""A companion's words to the probe (`workers.companions`): "ready" once per shape, "done" only after the probe
says halt, whether or not it could build or train the shape (a word out of turn is read as another companion's)."""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from studies import load_catalog
from workers.companions import _train_beside


class Steps:
    def __init__(self, fail_at: int | None) -> None:
        self.fail_at = fail_at

    def step(self, i: int) -> None:
        if i == self.fail_at:
            raise RuntimeError("out of memory")


def _words(build) -> tuple[list[str], bool, list[str]]:
    """The companion's first word, whether it ended before the probe said halt, and its words after."""
    todo, said, halt = queue.Queue(), queue.Queue(), threading.Event()
    spec = load_catalog("tiny")
    worker = threading.Thread(target=_train_beside, args=(build, spec.as_dict(), torch.get_num_threads(), todo,
                                                          said, halt), daemon=True)
    worker.start()
    todo.put("a shape")
    first = [said.get(timeout=60)]
    todo.put(None)  # no next shape: a companion that says "done" before halt would end now
    worker.join(0.5)  # a slow machine can only hide an early end, never invent one
    early = not worker.is_alive()
    halt.set()
    worker.join(60)
    after = []
    while not said.empty():
        after.append(said.get())
    return first, early, after


def _raise(spec, shape):
    raise ValueError("this shape does not build here")


@pytest.mark.parametrize("build", [_raise, lambda spec, shape: Steps(fail_at=3), lambda spec, shape: Steps(None)],
                         ids=["build fails", "a step fails", "trains"])
def test_ready_once_then_done_after_halt(build):
    first, early, after = _words(build)
    assert first == ["ready"] and not early and after == ["done"]
