"""Processes that train a shape beside the probe (`workers.probe`), as a phase's other trials will beside each one.

A phase runs several trials at once, and they share more than cores: on a 2-vCPU machine two one-thread trials each
stepped 2.2× slower than one alone. So the probe times a shape while `k - 1` companions train the same
shape in their own processes (spawned: a forked torch can hang in its thread pool), each stepping until told to stop.

`Companions(spec, n, threads, build)` starts `n` processes, which build each shape with `build` (the probe's `rig`);
`with companions.beside(shape, k):` has `k - 1` of them train `shape` for as long as the block runs; `close()` ends
them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Event
from typing import Any

from studies.estimate import Shape
from studies.spec import StudySpec

READY_S = 120.0  # a companion's start (torch's import) and its model's build, at most


Build = Callable[[StudySpec, Shape], Any]  # a shape built as a trial builds it, with `step(i)`


def _train_beside(build: Build, spec_data: dict[str, Any], threads: int, todo: Any, said: Any, halt: Event) -> None:
    """A companion's loop: for each shape it is given, build it, say "ready", step until `halt`, say "done"."""
    import torch

    torch.set_num_threads(threads)
    spec = StudySpec.model_validate(spec_data)
    while (shape := todo.get()) is not None:
        built = None
        with contextlib.suppress(Exception):  # a shape it cannot build: the probe times it without this companion
            built = build(spec, shape)
        said.put("ready")  # once, and "done" only after `halt`: the probe waits for each word from each companion
        with contextlib.suppress(Exception):  # nor train
            i = 0
            while built is not None and not halt.is_set():
                built.step(i)
                i += 1
        halt.wait()
        said.put("done")


class Companions:
    def __init__(self, spec: StudySpec, n: int, threads: int, build: Build) -> None:
        context = mp.get_context("spawn")
        self.halt, self.said = context.Event(), context.Queue()
        self.todo = [context.Queue() for _ in range(n)]
        self.processes = [context.Process(target=_train_beside, args=(build, spec.as_dict(), threads, todo, self.said,
                                                                      self.halt), daemon=True) for todo in self.todo]
        for process in self.processes:
            process.start()

    def _await(self, word: str, n: int) -> int:
        """How many of `n` companions said `word` within READY_S."""
        heard = 0
        with contextlib.suppress(queue.Empty):
            while heard < n:
                heard += self.said.get(timeout=READY_S) == word
        return heard

    @contextlib.contextmanager
    def beside(self, shape: Shape, k: int) -> Iterator[int]:
        """`k - 1` companions (as many as there are) train `shape` within; yields how many are training."""
        n = min(k - 1, len(self.todo))
        self.halt.clear()
        for todo in self.todo[:n]:
            todo.put(shape)
        ready = self._await("ready", n)
        try:
            yield ready
        finally:
            self.halt.set()
            self._await("done", n)

    def close(self) -> None:
        for todo in self.todo:
            todo.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
