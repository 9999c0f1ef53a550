"""Validation errors in the user's words: one account of them for the CLI's lines and the API's 422 bodies.

`field_problems(errors, root, data)` reads pydantic's error entries (a `ValidationError`'s or FastAPI's) into
`FieldProblem`s: pydantic's prefixes dropped and "Input should be" said "must be"; an unknown key with its
section's valid keys and the nearest one; a two-sided bound as its whole range ("0 < delta < 1"); each of a
spec's cross-field problems (`studies.spec.SpecProblems`) placed at the field its message starts with.
`as_json(problems, prefix)` is the API's 422 `detail`; `as_lines(problems, flags)` the CLI's lines, naming the
flag that set a field (tune.base_width → --from-width). Only the standard library at module level (`ptctl --help`
stays fast).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

Loc = tuple[str | int, ...]
_PREFIXES = ("Value error, ", "Assertion failed, ")
_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
# a field path leading a message: tune.base_width, transfer.widths[0], verify (then a space, =, :, or the end)
_LEADING_PATH = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[\d+\])*)(?=[\s=:,]|$)")


@dataclass(frozen=True)
class FieldProblem:
    loc: Loc  # the field path in the validated model (`root`), list indices as ints
    msg: str
    type: str
    value: str | None = None  # the given value, when short and plain (shown after a flag: --from-width -32)


# ---------------------------------------------------------------------------------- reading pydantic's errors
def field_problems(errors: Iterable[Mapping[str, Any]], root: type[BaseModel] | None = None,
                   data: Any = None) -> list[FieldProblem]:
    """`errors` (pydantic's entries) in the user's words; `root` is the model validated and `data` what it was
    given (both optional: without them an unknown key gets no list of valid ones)."""
    out: list[FieldProblem] = []
    merge = False  # the last problem was one member of a union: the next member's joins it
    for e in errors:
        loc, kind = _without_tags(tuple(e.get("loc", ())), data), str(e.get("type", ""))
        union = len(loc) < len(e.get("loc", ()))
        error = (e.get("ctx") or {}).get("error")
        messages = list(getattr(error, "problems", None) or [_words(str(e.get("msg", "")))])
        for msg in messages:
            if kind == "extra_forbidden" and loc:
                msg = _unknown_key(root, loc, data)
            elif kind in _BOUNDS and root is not None and loc:
                field = _walk(root, loc, data)[1]
                span = _range(field, str(loc[-1])) if field is not None else None
                msg += f" ({span})" if span else ""
            place = _placed(loc, msg, root, data) if kind.endswith("value_error") else loc
            problem = FieldProblem(place, msg, kind, _plain(e.get("input")) if place == loc else None)
            if union and merge and out[-1].loc == place:
                problem = FieldProblem(place, f"{out.pop().msg}; or {msg}", kind, problem.value)
            out.append(problem)
            merge = union
    return out


def _without_tags(loc: Loc, data: Any) -> Loc:
    """`loc` without the tags pydantic adds for a union's members (`verify.tolerance.literal[...]`): parts under
    a value that is neither a map nor a list (known only when `data` is given)."""
    if data is None:
        return loc
    kept: list[str | int] = []
    value = data
    for part in loc:
        if value is not None and not isinstance(value, dict | list) and kept:
            continue
        kept.append(part)
        value = _child(value, part)
    return tuple(kept)


def _words(msg: str) -> str:
    for prefix in _PREFIXES:
        msg = msg.removeprefix(prefix)
    return "must be" + msg[len("Input should be"):] if msg.startswith("Input should be") else msg


def _plain(value: Any) -> str | None:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float | str) and len(str(value)) <= 40:
        return str(value)
    return None


def _unknown_key(root: type[BaseModel] | None, loc: Loc, data: Any) -> str:
    from studies.words import did_you_mean

    models = _walk(root, loc[:-1], data)[0] if root is not None else []
    valid = list(dict.fromkeys(f.alias or name for m in models for name, f in m.model_fields.items()))
    if not valid:
        return "unknown key: remove it"
    hint = did_you_mean(str(loc[-1]), valid)
    return f"unknown key{'; ' + hint if hint else ''} (valid keys here: {', '.join(valid)})"


def _range(field: FieldInfo, name: str) -> str | None:
    """A field's allowed range when it is bounded on both sides ("0 < delta < 1"), else None."""
    import annotated_types as at

    low = high = None
    for m in field.metadata:
        if isinstance(m, at.Gt | at.Ge):
            low = f"{m.gt if isinstance(m, at.Gt) else m.ge} {'<' if isinstance(m, at.Gt) else '<='} "
        if isinstance(m, at.Lt | at.Le):
            high = f" {'<' if isinstance(m, at.Lt) else '<='} {m.lt if isinstance(m, at.Lt) else m.le}"
    return f"allowed: {low}{name}{high}" if low and high else None


# ---------------------------------------------------------------------------------- the models along a path
def _walk(root: type[BaseModel] | None, loc: Loc, data: Any) -> tuple[list[type[BaseModel]], FieldInfo | None]:
    """The models that may hold the keys under `loc`, and the field at `loc` (None: a list item, a map's key, a
    union's tag); `data` picks the class of a family-dependent field (a model's arch, a space)."""
    models: list[type[BaseModel]] = [root] if root is not None else []
    field: FieldInfo | None = None
    parent = data
    for part in loc:
        hit = next(((name, f) for m in models for name, f in m.model_fields.items() if part in (name, f.alias)),
                   None) if isinstance(part, str) else None
        if hit is not None:
            name, field = hit
            models = _family_model(name, _models_in(field.annotation), parent) or _models_in(field.annotation)
        else:
            field = None  # an index or a key: the models stay those of the items
        parent = _child(parent, part)
    return models, field


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _family_model(name: str, models: list[type[BaseModel]], parent: Any) -> list[type[BaseModel]] | None:
    """The class a family-dependent field holds (`studies.arch.ModelSpec.arch`, a spec's `space`), from the family
    `parent` names (its `family`, or its `model.family`); None for any other field."""
    from pydantic import BaseModel

    from studies.family import FAMILIES
    from studies.model import ModelSpec
    from studies.space import Space

    parent = parent if isinstance(parent, dict) else {}
    if name == "arch" and models == [BaseModel]:
        family = parent.get("family")
    elif name == "space" and models == [Space]:
        model = parent.get("model")
        family = model.get("family") if isinstance(model, dict) else None
    else:
        return None
    entry = FAMILIES.get(family if isinstance(family, str) else "") or FAMILIES[ModelSpec.model_fields["family"]
                                                                                 .default]
    return [entry.arch if name == "arch" else entry.space]


def _child(value: Any, part: str | int) -> Any:
    if isinstance(value, dict):
        return value.get(part)
    if isinstance(value, list) and isinstance(part, int) and -len(value) <= part < len(value):
        return value[part]
    return None


def segments(path: str) -> Loc:
    """"transfer.widths[0]" → ("transfer", "widths", 0)."""
    return tuple(int(p) if p.isdigit() else p for p in re.findall(r"[A-Za-z_]\w*|\d+", path))


def _placed(loc: Loc, msg: str, root: type[BaseModel] | None, data: Any) -> Loc:
    """Where a validator's message belongs: the field path it starts with, when that path is a field at or under
    `loc` (a model's own check names its field: `data.path is required ...` at `data` → data.path)."""
    match = _LEADING_PATH.match(msg)
    if match is None or root is None:
        return loc
    path = segments(match.group(1))
    if loc and path[0] == loc[-1] and len(path) > 1 and path[:len(loc)] != loc:
        return loc[:-1] + path  # `hparams.w_H=...` at validate.hparams: the message names the field and a key
    candidate = path if path[:len(loc)] == loc and len(path) > len(loc) else loc + path
    return candidate if _walk(root, candidate[:len(loc) + 1], data)[1] is not None else loc


# ---------------------------------------------------------------------------------- rendering
def as_json(problems: Iterable[FieldProblem], prefix: Sequence[str | int] = ("body",)) -> list[dict[str, Any]]:
    """The API's 422 `detail`: one `{loc, msg, type}` per problem, `loc` under `prefix` ("body", "query")."""
    return [{"loc": [*prefix, *p.loc], "msg": p.msg, "type": p.type} for p in problems]


def path_text(loc: Sequence[str | int]) -> str:
    """("transfer", "widths", 0) → "transfer.widths[0]"."""
    return "".join(f"[{p}]" if isinstance(p, int) else f"{'.' if i else ''}{p}" for i, p in enumerate(loc))


def flag_of(loc: Loc, flags: Mapping[str, str]) -> str | None:
    """The flag that set the field at `loc` (or a section above it), if any."""
    names = [p for p in loc if isinstance(p, str)]
    return next((flags[k] for n in range(len(names), 0, -1) if (k := ".".join(names[:n])) in flags), None)


def _with_value(flag: str, value: str | None) -> str:
    return flag if value is None else f"{flag}{'' if flag.endswith('=') else ' '}{value}"


def _in_flags(msg: str, flags: Mapping[str, str]) -> str:
    """`msg` with each field it names as `path=value`, `path[i]=value` or a dotted path said as its flag
    (transfer.widths[0]=64 → --to 64), in one pass (a flag put in is not read again); a bare word (width) is left
    alone: it may be prose."""
    if not flags:
        return msg
    keys = sorted(flags, key=len, reverse=True)  # the longest first: tune.base_width before base_width
    names = "|".join(rf"(?P<k{i}>{re.escape(k)})(?:\[\d+\])?{'' if '.' in k else '(?==)'}" for i, k in enumerate(keys))
    pattern = rf"(?<![\w.-])(?:{names})(?:=(?P<value>[^\s,;:)]+))?(?!\w)"
    return re.sub(pattern, _said_as(keys, flags), msg)


def _said_as(keys: Sequence[str], flags: Mapping[str, str]) -> Callable[[re.Match[str]], str]:
    def said(match: re.Match[str]) -> str:
        key = next(k for i, k in enumerate(keys) if match.group(f"k{i}") is not None)
        return _with_value(flags[key], match.group("value")).rstrip("=")
    return said


def as_lines(problems: Iterable[FieldProblem], flags: Mapping[str, str] | None = None) -> list[str]:
    """One line per problem, each once: `path: message`, or `--flag value: message` for a field a flag set; a
    message that starts with its own field is shown alone (the field is not named twice)."""
    flags = flags or {}
    lines: list[str] = []
    for p in problems:
        path, flag, msg = path_text(p.loc), flag_of(p.loc, flags), _in_flags(p.msg, flags)
        subject = _with_value(flag, p.value).rstrip("=") if flag else path
        tail = next((t for k in range(1, len(p.loc)) if isinstance(p.loc[k], str)
                     and re.match(rf"{re.escape(t := path_text(p.loc[k:]))}[\s=\[.]", msg)), None)
        if not p.loc or any(re.match(rf"{re.escape(s)}(?![\w-])", msg) for s in (path, flag or path)):
            line = msg
        elif tail is not None and not flag:
            line = path + msg[len(tail):]  # "lrs [...] must be ..." at validate.lrs: the whole path, once
        else:
            line = f"{subject}: {msg}"
        if line not in lines:
            lines.append(line)
    return lines


def flagged(problems: Iterable[FieldProblem], flags: Mapping[str, str]) -> bool:
    """Whether every problem is about a field a flag set (the command line alone is to fix)."""
    return all(flag_of(p.loc, flags) is not None for p in problems)
