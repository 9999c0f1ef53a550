"""A trial's chatter goes to its log file: `quiet(path)` sends what Python code writes to sys.stdout/sys.stderr and
every `warnings.warn` to `path` while a trial builds and trains its model (`workers.train.train`), not to the
terminal (a plugin family's "number of parameters: …", torch's `enable_nested_tensor` UserWarning, on every trial).

sys.stdout, sys.stderr and `warnings.showwarning` are process-global, so they are replaced by routers: the thread
that entered `quiet` (the trial's: a Ray trial actor trains in a thread of its own) writes to the log, every other
thread where it wrote before (a live progress bar's refresh thread, Ray's own). The caller's callbacks (ptctl's
progress, Tune's reports) run through `Quiet.aloud`, with the streams the trial found. An exception still
propagates; its traceback is also appended to the log. Python level only: a C extension writing to file descriptors
1 and 2 still reaches them, and so does a thread the model starts itself.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, ParamSpec, TextIO, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")


class _Routed:
    """A stream: the trial thread's text to `log`, any other thread's to `other` (the stream it replaces)."""

    def __init__(self, log: IO[str], other: TextIO, thread: int) -> None:
        self.log, self.other, self.thread = log, other, thread

    def _target(self) -> IO[str]:
        return self.log if threading.get_ident() == self.thread else self.other

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, rich's `rich_proxied_file`: the target's
        return getattr(self._target(), name)


class Quiet:
    """What `quiet` yields: `aloud(fn)` is `fn` run with the streams as they were before the trial (itself when
    nothing was redirected)."""

    def __init__(self, streams: tuple[TextIO, TextIO] | None) -> None:
        self.streams = streams

    def aloud(self, fn: Callable[P, R]) -> Callable[P, R]:
        if self.streams is None:
            return fn
        out, err = self.streams

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                return fn(*args, **kwargs)

        return call


@contextlib.contextmanager
def quiet(path: Path | None) -> Iterator[Quiet]:
    """Within it, this thread's stdout, stderr and warnings are appended to `path` (created with its folder; a
    retried trial's attempts follow each other); `path` None: nothing is redirected."""
    if path is None:
        yield Quiet(None)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    me, found = threading.get_ident(), (sys.stdout, sys.stderr)
    with open(path, "a", buffering=1, encoding="utf-8") as log:  # line-buffered: a killed trial keeps its lines
        out, err = (cast(TextIO, _Routed(log, stream, me)) for stream in found)
        # catch_warnings restores filters and showwarning after, and resets "shown once": each trial logs its own
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            shown = warnings.showwarning

            def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
                if threading.get_ident() == me:
                    log.write(warnings.formatwarning(message, category, filename, lineno, line))
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            try:
                yield Quiet(found)
            except Exception:
                traceback.print_exc(file=log)
                raise
