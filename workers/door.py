"""The API's model check in a child process: `workers.model_check.check_study` under a memory and a time cap, so
that no spec can make the web process build, run or allocate a model.

The child (`python -m workers.door`) imports torch and the families once, caps its address space at what the
imports took plus `memory_bytes`, then answers one JSON line per spec line on stdin: `{"ok": true}`, or an error
with its kind (`contract`: the model breaks its contract; `spec`: a spec value the model cannot take; `memory`:
the check's small model needs more than the cap). A check past `timeout_s` kills the child; the next check starts
a new one. `Door` keeps the answers of the last `CACHED` model shapes.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from studies.spec import StudySpec
from workers.errors import ConfigError, message

log = logging.getLogger(__name__)
CACHED = 256  # model shapes whose answer is kept
START_S = 180.0  # how long the child may take to import torch and the families (a loaded machine: tens of s)
Kind = Literal["contract", "spec", "memory", "time", "crash"]


@dataclass(frozen=True)
class Refusal:
    """Why the check refused a spec: its kind (module docstring) and one line in the user's words."""

    kind: Kind
    message: str


class DoorUnavailable(RuntimeError):
    """The child could not be started (an infrastructure problem, not the spec's)."""


class Door:
    """The parent's side: one child at a time, started on the first check and again after one was killed."""

    def __init__(self, memory_bytes: int, timeout_s: float, env: Mapping[str, str] | None = None) -> None:
        """`env`: the child's environment (None: this process's); the API passes its own less its secrets."""
        self.memory_bytes, self.timeout_s = memory_bytes, timeout_s
        self.env = dict(os.environ if env is None else env)
        self._child: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._answers: OrderedDict[str, Refusal | None] = OrderedDict()

    def check(self, spec: StudySpec) -> Refusal | None:
        """Why the study's model fails the check (None: it passes)."""
        try:
            key = _shape(spec)
        except ValueError as exc:  # a width the arch cannot build: the spec's, said as the child would
            return Refusal("spec", message(exc))
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
            answer = self._ask(spec.model_dump_json(by_alias=True))
            if answer is None or answer.kind in ("contract", "spec", "memory"):  # the same spec: the same answer
                self._answers[key] = answer
                if len(self._answers) > CACHED:
                    self._answers.popitem(last=False)
            return answer

    def close(self) -> None:
        with self._lock:
            self._stop()

    # ------------------------------------------------------------------ the child
    def _ask(self, spec_json: str) -> Refusal | None:
        child = self._started()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(spec_json + "\n")
        child.stdin.flush()
        line = _read_line(child, self.timeout_s)
        if line is None:
            self._stop()
            return Refusal("time", f"the model check (a forward on a few tokens at a small width) took over "
                                   f"{self.timeout_s:g} s (PTCTL_DOOR_TIMEOUT_S): check the model's forward for "
                                   "a loop that does not end, or raise PTCTL_DOOR_TIMEOUT_S")
        if not line:
            code = child.wait()
            self._child = None
            return Refusal("crash", f"the model check's process died (exit status {code}) while building or running "
                                    "the model at a small width: the model's code crashed the interpreter")
        answer = json.loads(line)
        return None if answer.get("ok") else Refusal(answer["kind"], answer["message"])

    def _started(self) -> subprocess.Popen[str]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = {**self.env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
        child = subprocess.Popen([sys.executable, "-m", "workers.door", str(self.memory_bytes)], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready = _read_line(child, START_S)
        if not ready or not json.loads(ready).get("ready"):
            child.kill()
            child.wait()
            raise DoorUnavailable(f"the model check's process did not start within {START_S:g} s")
        self._child = child
        return child

    def _stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None


def _shape(spec: StudySpec) -> str:
    """What the check's answer depends on: the shapes it builds and runs (`workers.model_check.door_shapes`)."""
    from workers.model_check import door_shapes  # torch: only once a check is asked for

    return json.dumps(door_shapes(spec))


def _read_line(child: subprocess.Popen[str], timeout_s: float) -> str | None:
    """The child's next line ('' when it died), or None when none came within `timeout_s`."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(child.stdout.readline() if child.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else None


# ---------------------------------------------------------------------- the child's side
def _answer(spec_json: str) -> dict[str, Any]:
    from workers.model_check import check_study

    try:
        check_study(StudySpec.model_validate_json(spec_json))
    except ConfigError as exc:
        return {"kind": "contract", "message": str(exc)}
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "allocate" not in str(exc):
            raise
        return {"kind": "memory", "message": "the model check's small model (a small width, a few tokens) needed "
                f"more than {int(sys.argv[1]) / 2**20:.0f} MiB (PTCTL_DOOR_MEMORY_MB): lower the model's sizes "
                "in model.arch, or raise PTCTL_DOOR_MEMORY_MB"}
    except ValueError as exc:
        return {"kind": "spec", "message": message(exc)}
    return {"ok": True}


def _cap_memory(extra: int) -> None:
    """Cap this process's address space at what it maps now plus `extra` bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        mapped = next(int(x.split()[1]) * 1024 for x in status if x.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def main() -> None:
    import torch

    import studies  # noqa: F401  # the families, plugins included
    import workers.model_check  # noqa: F401

    torch.set_num_threads(1)
    _cap_memory(int(sys.argv[1]))
    _say({"ready": True})
    for line in sys.stdin:
        try:
            answer = _answer(line)
        except Exception as exc:  # ptctl's own bug: said as such, the child lives on
            log.exception("the model check failed")
            answer = {"kind": "crash", "message": f"the model check failed: {type(exc).__name__}: {exc}"}
        _say(answer)


if __name__ == "__main__":
    main()
