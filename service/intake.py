"""A `StudySpec` from a request body, off the event loop: nothing a client sends can stall other requests.

`read_spec(request)` checks the Content-Type (415), reads at most `PTCTL_MAX_BODY_BYTES` (413) and counts the
body's structure (over `PTCTL_MAX_NODES`: 413, since C parsers hold the GIL), then parses and validates it in a
pool of `PTCTL_MAX_PARSES` threads of its own, so the sync endpoints' pool is never exhausted. A body waits at
most `PTCTL_MAX_PARSE_S` for a thread (503) and is given as long to finish (422); its slot is freed only when
its thread really ends. `parse_spec(body, media, limits)` is the pure part, cheap checks first: UTF-8 only (400);
JSON or YAML with YAML 1.2 numbers and no anchors or aliases (an alias bomb; 400); bounds (`service.limits`,
422); finite numbers and valid Unicode (422); `StudySpec` in strict mode (422). The answers: docs/control-plane.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import yaml
from fastapi import HTTPException, Request
from pydantic import ValidationError

from service.field_errors import as_json, field_problems
from service.limits import Limits, check
from studies.spec import StudySpec

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPES = ("application/json", "")
_EXAMPLE = "see studies/catalog/tiny.yaml"


# ---------------------------------------------------------------------------------- YAML
class _Loader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):  # type: ignore[misc]
    """Safe YAML with JSON's numbers (YAML 1.2: `1e6`, `1.7e7` are floats) and no timestamps (dates stay text)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:timestamp",
                                                                        "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """`text` as plain data; a `yaml.YAMLError` for an anchor or alias (checked before anything is built)."""
    loader = _Loader(text)
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = f" (line {event.start_mark.line + 1})" if event.start_mark else ""
                raise yaml.YAMLError(f"YAML anchors and aliases (&name, *name) are not accepted{mark}: "
                                     "write the values out")
        return loader.get_single_data()
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------- parsing
def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows: use a finite number")


def _bad_values(data: Any, loc: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Non-finite floats, invalid Unicode (lone surrogates) and non-text keys, with their paths."""
    def error(msg: str, kind: str) -> dict[str, Any]:
        return {"loc": ["body", *loc], "msg": msg, "type": kind}

    if isinstance(data, float) and not math.isfinite(data):
        return [error(f"{data} is not allowed: use a finite number", "finite_number")]
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError as exc:
            return [error(f"invalid Unicode at character {exc.start}: a lone surrogate ({data[exc.start]!a}) is "
                          "not text; send valid UTF-8", "unicode")]
        return []
    errors = []
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                errors.append(error(f"key {key!r} is not text: quote it", "key_type"))
            errors += _bad_values(key, (*loc, "(key)")) if isinstance(key, str) else []
            errors += _bad_values(value, (*loc, key if isinstance(key, str | int) else repr(key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            errors += _bad_values(value, (*loc, i))
    elif not (data is None or isinstance(data, bool | int | float)):
        errors.append(error(f"a YAML {type(data).__name__} is not JSON data: use text, numbers, lists and maps",
                            "value_type"))
    return errors


def _decode(body: bytes, media: str, max_depth: int) -> Any:
    try:
        text = body.decode("utf-8")
        if "\x00" in text:
            raise UnicodeError("NUL")
        return load_yaml(text) if media in YAML_TYPES else json.loads(text, parse_constant=_reject_constant)
    except UnicodeError:
        raise HTTPException(400, "the body is not UTF-8 text (UTF-16/32 are not accepted): send UTF-8") from None
    except json.JSONDecodeError as exc:
        raise HTTPException(400, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except yaml.YAMLError as exc:
        raise HTTPException(400, f"malformed YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise _too_deep(None, max_depth) from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's 4300-digit guard, whose message advises sys
            raise HTTPException(400, "malformed body: a number has over 4300 digits; no StudySpec field takes "
                                "one: send the number as a StudySpec has it (e.g. 16, 0.003, 1e-4)") from None
        raise HTTPException(400, f"malformed body: {exc}"[:300]) from None


def parse_spec(body: bytes, media: str, limits: Limits) -> StudySpec:
    """The body as a `StudySpec`: 400 malformed, 422 invalid, over a bound or not strictly typed (field paths)."""
    data = _decode(body, media, limits.depth)
    depth = nesting(data)
    if depth > limits.depth:
        raise _too_deep(depth, limits.depth)
    if not isinstance(data, dict):
        raise HTTPException(422, f"the body must be a StudySpec object, not {type(data).__name__}: {_EXAMPLE}")
    try:
        errors = check(data, limits) or _bad_values(data)  # bounds first: they stop at the first long list
        if errors:
            raise HTTPException(422, errors)
        return StudySpec.model_validate_json(json.dumps(data), strict=True, context={"strict": True})
    except ValidationError as exc:  # in the user's words, as the CLI says them (`service.field_errors`)
        problems = field_problems(exc.errors(include_url=False), StudySpec, data)
        raise HTTPException(422, as_json(problems)) from None
    except RecursionError:
        raise _too_deep(None, limits.depth) from None


def nesting(data: Any) -> int:
    """How deep `data`'s lists and maps lie inside each other (a scalar: 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack += [(child, depth + 1) for child in children]
    return deepest


_OPENERS = re.compile(rb'(?:[\[{]\s*(?:"[^"\\]{0,64}"\s*:\s*)?)+')  # `[[`, `{"a": {`
_YAML_OPENERS = re.compile(rb'(?:[\[{]\s*(?:"[^"\\]{0,64}"\s*:\s*)?|-[ \t]+)+')  # and YAML's `- - `


def check_depth(body: bytes, media: str, max_depth: int) -> None:
    """400 for a body that opens more than `max_depth` lists or maps in a row (found in C, before anything is
    parsed or counted); a body nested deeper some other way is refused as deep after parsing (`nesting`)."""
    openers = _YAML_OPENERS if media in YAML_TYPES else _OPENERS
    runs = (m.group(0) for m in openers.finditer(body))
    deepest = max((sum(run.count(c) for c in (b"[", b"{", b"- ", b"-\t")) for run in runs), default=0)
    if deepest > max_depth:
        raise _too_deep(deepest, max_depth)


def _too_deep(depth: int | None, max_depth: int) -> HTTPException:
    seen = f"{depth} levels" if depth is not None else "too many levels"
    return HTTPException(400, f"malformed body: lists and maps nest {seen} deep, over PTCTL_MAX_DEPTH={max_depth}; "
                              "a StudySpec nests 6 deep (see studies/catalog/tiny.yaml)")


# ---------------------------------------------------------------------------------- off the loop
def media_type(request: Request) -> str:
    """The body's media type; 415 for one that is not JSON or YAML, or a charset other than UTF-8."""
    content_type = request.headers.get("content-type", "")
    media, *params = (p.strip().lower() for p in content_type.split(";"))
    if not (media in YAML_TYPES or media in JSON_TYPES or media.endswith("+json")):
        raise HTTPException(415, f"Content-Type {media!r} is not accepted: send application/json or "
                            "application/yaml")
    charset = next((p.partition("=")[2].strip('"') for p in params if p.startswith("charset=")), "utf-8")
    if charset.replace("_", "-") not in ("utf-8", "utf8"):
        raise HTTPException(415, f"charset {charset!r} is not accepted: send UTF-8 (charset=utf-8)")
    return "application/yaml" if media in YAML_TYPES else "application/json"


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, or 413 past `max_bytes` (by Content-Length before reading, else while it streams in)."""
    length = request.headers.get("content-length")
    over = f"request body over {max_bytes} bytes (PTCTL_MAX_BODY_BYTES): send a smaller spec"
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        raise HTTPException(413 if length.isdigit() else 400, over if length.isdigit() else
                            "invalid Content-Length header")
    chunks, seen = [], 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > max_bytes:
            raise HTTPException(413, over)
        chunks.append(chunk)
    return b"".join(chunks)


def _release(slots: asyncio.Semaphore) -> Callable[[asyncio.Future[StudySpec]], None]:
    def done(future: asyncio.Future[StudySpec]) -> None:
        slots.release()
        if not future.cancelled():
            future.exception()  # retrieved: a parse that timed out is not logged as an unhandled error

    return done


class Parser:
    """Parses bodies in `limits.parses` threads of its own, each given `limits.parse_s` seconds."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.pool = ThreadPoolExecutor(limits.parses, thread_name_prefix="ptctl-parse")
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.limits.parses))
        return self._slots[1]

    async def parse(self, body: bytes, media: str) -> StudySpec:
        slots, wait = self._semaphore(), self.limits.parse_s
        try:
            await asyncio.wait_for(slots.acquire(), wait)
        except TimeoutError:
            raise HTTPException(503, f"every spec parser is busy (PTCTL_MAX_PARSES={self.limits.parses}): "
                                "retry in a few seconds", headers={"Retry-After": "2"}) from None
        try:
            future = asyncio.get_running_loop().run_in_executor(self.pool, parse_spec, body, media, self.limits)
        except BaseException:
            slots.release()
            raise
        future.add_done_callback(_release(slots))  # the slot frees when the thread ends, not before
        try:
            return await asyncio.wait_for(asyncio.shield(future), wait)
        except TimeoutError:
            raise HTTPException(422, f"the spec took over {wait:g} s to parse and validate (PTCTL_MAX_PARSE_S): "
                                "send a simpler spec") from None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


async def read_spec(request: Request) -> StudySpec:
    """The request's `StudySpec` (415, 413, 400, 422, 503 as above)."""
    settings = request.app.state.settings
    media = media_type(request)
    body = await read_body(request, settings.max_body_bytes)
    check_depth(body, media, settings.limits.depth)  # one answer at every depth: before the count a deep body tops
    check_nodes(body, settings.limits.nodes)
    return await cast(Parser, request.app.state.parser).parse(body, media)


def check_nodes(body: bytes, max_nodes: int) -> None:
    """413 for a body with more than `max_nodes` lists, maps, items or lines (counted in C, in microseconds):
    `json.loads` holds the GIL for all of its parse, and 850 kB of nested lists took it for 144 ms."""
    nodes = sum(body.count(c) for c in (b"[", b"{", b",", b"\n"))
    if nodes > max_nodes:
        raise HTTPException(413, f"the body has {nodes} lists, maps, items or lines, over PTCTL_MAX_NODES="
                            f"{max_nodes}: a StudySpec needs a few hundred")
