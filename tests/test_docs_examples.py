"""The README and docs/*.md say only what is true: their commands, specs, links and file map are checked here.

Every fenced block of README.md and docs/*.md (docs/LOG.md aside: a record, not instructions) names its language.
- ```yaml blocks parse (`yaml.safe_load`); one with `model:` or `tune:` at its top level is a study spec and
  validates as a `StudySpec` unless the line before its fence is `<!-- fragment -->`. A spec that names a family
  one of the page's `<!-- example: NAME -->` python blocks defines (docs/plugins.md) validates with that example
  registered, as an installed plugin would be.
- ```bash, ```sh and ```console blocks: each command line (in console blocks, the lines after `$ `; leading
  `VAR=value` assignments and `# comments` dropped) is checked by its first word. `ptctl ...` parses with the real
  parser (`service.cli.build_parser`), so the subcommand and every flag exist; `ptctl study plan FILE` on an
  existing spec runs in process without the timed probe (no torch, Ray or MLflow). `make TARGET` names a target of
  the Makefile. Any other line is only non-empty. On every line, an argument that is a repository path
  (`studies/catalog/tiny.yaml`, `tests/workers/test_depth.py`) exists.
- ```text (output, file maps) and other languages are not run.
Also: every relative link (and its #anchor, as GitHub makes them) resolves; the README's file map lists exactly the
production files of analysis/, studies/, workers/ and service/; the README stays a summary (about 200 lines);
docs/studies.md lists every catalog spec and names only real spec fields; every `PTCTL_*` setting the docs name
exists in the code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "LOG.md")]
LINKED = [*PAGES, ROOT / "docs" / "LOG.md"]  # links are checked on every page, the record's included
PACKAGES = ("analysis", "studies", "workers", "service")
SHELL = {"bash", "sh", "console"}
FRAGMENT = "<!-- fragment -->"
README_MAX_LINES = 210  # "at most ~200": a summary that points at docs/

FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*\s+")
EXAMPLE = re.compile(r"^<!-- example: (\S+) -->\n```python\n(.*?)^```$", re.M | re.S)
EXAMPLE_HEADER = re.compile(r'# (\w+)\.py +\(entry point: ([\w.-]+) = "(\w+):(\w+)"\)')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line that is not inside a fenced block."""
    out, inside = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            out.append((i, line))
    return out


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a fence that is never closed"
        fragment = i > 0 and lines[i - 1].strip() == FRAGMENT
        found.append(Block(page, i + 1, opening.group(1).lower(), "\n".join(lines[i + 1:end]), fragment))
        i = end + 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
YAML_BLOCKS = [b for b in ALL_BLOCKS if b.lang in {"yaml", "yml"}]
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang in SHELL]


def commands(block: Block) -> list[str]:
    """The block's command lines: continuations joined, comments and blank lines dropped, console output skipped."""
    raw = block.text.splitlines()
    if block.lang == "console":
        raw = [line.strip()[2:] for line in raw if line.strip().startswith("$ ")]
    joined: list[str] = []
    pending = ""
    for line in raw:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        joined.append(pending)
    out = []
    for line in joined:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        while ASSIGNMENT.match(line):  # PTCTL_SERVER=... ptctl study submit ...
            line = ASSIGNMENT.sub("", line, count=1)
        out.append(line)
    return out


def _words(line: str) -> list[str]:
    return shlex.split(line, comments=True)


# ------------------------------------------------------------------------------------------------ every block


def test_the_pages_have_fenced_blocks_to_check():
    assert YAML_BLOCKS and SHELL_BLOCKS, "no yaml or shell blocks found: has the fence syntax changed?"


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_every_fenced_block_names_its_language(block: Block):
    assert block.lang, (f"{block.where}: a fenced block without a language; mark output samples and other "
                        "text that is not to be run ```text")


# ------------------------------------------------------------------------------------------------ yaml


def _is_spec(data: object) -> bool:
    return isinstance(data, dict) and ("model" in data or "tune" in data)


@contextlib.contextmanager
def _example_families(page: Path, tmp_path: Path):
    """Register the families the page's `<!-- example: NAME -->` python blocks define, as installed plugins would
    load (`studies.family._load`), for the duration of the block; the registry is restored after."""
    from studies import family as registry
    from studies.family import ENTRY_POINT_GROUP

    sources = [source for _, source in EXAMPLE.findall(page.read_text(encoding="utf-8"))]
    saved = {name: dict(getattr(registry, name)) for name in ("FAMILIES", "PLUGINS", "BROKEN")}
    modules = []
    sys.path.insert(0, str(tmp_path))
    try:
        for source in sources:
            header = EXAMPLE_HEADER.match(source.splitlines()[0])
            assert header, f"{page.name}: an example's first line names no module and entry point: {source[:80]!r}"
            module, ep_name, ep_module, attr = header.groups()
            (tmp_path / f"{module}.py").write_text(source, encoding="utf-8")
            modules.append(module)
            problem = registry._load(EntryPoint(ep_name, f"{ep_module}:{attr}", ENTRY_POINT_GROUP))
            assert problem is None, f"{page.name}: example {module}: {problem}"
        yield
    finally:
        for name, before in saved.items():
            getattr(registry, name).clear()
            getattr(registry, name).update(before)
        for module in modules:
            sys.modules.pop(module, None)
        sys.path.remove(str(tmp_path))
        importlib.invalidate_caches()


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.where)
def test_yaml_blocks_parse_and_specs_validate(block: Block, tmp_path: Path):
    try:
        data = yaml.safe_load(block.text)
    except yaml.YAMLError as e:
        pytest.fail(f"{block.where}: the YAML does not parse: {e}")
    if not _is_spec(data) or block.fragment:
        return
    from pydantic import ValidationError

    from studies import StudySpec
    from studies.family import family_names

    named = (data.get("model") or {}).get("family") if isinstance(data.get("model"), dict) else None
    context = (_example_families(block.page, tmp_path) if named and named not in family_names()
               else contextlib.nullcontext())
    with context:
        try:
            StudySpec.model_validate(data)
        except ValidationError as e:
            pytest.fail(f"{block.where}: a study spec that does not validate (mark a deliberate part of one with "
                        f"{FRAGMENT} on the line before its fence):\n{e}")


def test_a_fragment_marker_is_always_followed_by_a_fence():
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() == FRAGMENT:
                assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), (
                    f"{page.relative_to(ROOT)}:{i + 1}: {FRAGMENT} must sit on the line just before a fence")


# ------------------------------------------------------------------------------------------------ shell


def _parse_ptctl(argv: list[str], where: str) -> argparse.Namespace:
    from service.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `ptctl {shlex.join(argv)}` is not a valid command line (exit {e.code}): "
                    f"{err.getvalue().strip()}")


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def _repo_paths(words: list[str]) -> list[str]:
    """Arguments that name a path inside the repository (relative, with a folder, no URL, no variable)."""
    out = []
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if ("/" not in value or "://" in value or value.startswith(("/", "~", "$", "-", "<", ".."))
                or any(c in value for c in "*$<>()'\"")):
            continue
        out.append(value)
    return out


SHELL_LINES = [(b, line) for b in SHELL_BLOCKS for line in commands(b)]


@pytest.mark.parametrize(("block", "line"), SHELL_LINES, ids=[f"{b.where}:{line[:40]}" for b, line in SHELL_LINES])
def test_shell_lines_name_real_commands_flags_targets_and_files(block: Block, line: str, capsys, tmp_path: Path):
    words = _words(line)
    assert words, f"{block.where}: an empty command line: {line!r}"
    for path in _repo_paths(words):
        assert (ROOT / path).exists(), f"{block.where}: `{line}` names {path}, which does not exist"
    if words[0] == "ptctl":
        # the page's example plugins are families its commands may name (`--model tinylm`), as once installed
        examples = EXAMPLE.search(block.page.read_text(encoding="utf-8")) is not None
        with _example_families(block.page, tmp_path) if examples else contextlib.nullcontext():
            args = _parse_ptctl(words[1:], block.where)
        if getattr(args, "study_command", None) == "plan" and (ROOT / args.file).is_file():
            args.file = str(ROOT / args.file)
            args.probe = False  # the FLOPs from the shapes; the timed probe would import torch and train
            assert args.func(args) == 0, f"{block.where}: `{line}` failed"
            assert "plan" in capsys.readouterr().out, f"{block.where}: `{line}` printed no plan"
    elif words[0] == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        missing = set(targets) - _makefile_targets()
        assert targets and not missing, f"{block.where}: `{line}`: no Makefile target {sorted(missing)}"


# ------------------------------------------------------------------------------------------------ links


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _outside_fences(page.read_text(encoding="utf-8")):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = _slug(heading.group(1))
            n = seen.get(slug, 0)
            out.add(f"{slug}-{n}" if n else slug)  # GitHub numbers a repeated heading's anchor
            seen[slug] = n + 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in _outside_fences(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            out.append((number, m.group(1) or m.group(2)))
    return out


RELATIVE_LINKS = [(page, number, target) for page in LINKED for number, target in links(page)
                  if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


@pytest.mark.parametrize(("page", "number", "target"), RELATIVE_LINKS,
                         ids=[f"{p.relative_to(ROOT)}:{n}:{t}" for p, n, t in RELATIVE_LINKS])
def test_relative_links_point_at_existing_files_and_headings(page: Path, number: int, target: str):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    where = f"{page.relative_to(ROOT)}:{number}"
    assert file.exists(), f"{where}: the link {target!r} points at {file}, which does not exist"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), (f"{where}: the link {target!r}: {file.name} has no heading "
                                         f"#{anchor}; its anchors: {sorted(anchors(file))}")


# ------------------------------------------------------------------------------------------------ the README


def production_files() -> set[str]:
    files = {p.relative_to(ROOT).as_posix() for package in PACKAGES for p in (ROOT / package).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".pyc", ".pyo"}}
    for folder in GLOBBED:  # a folder of like files, one line for all
        like = {f for f in files if fnmatch(f, folder)}
        files = (files - like) | ({folder} if like else set())
    return files


GLOBBED = ("studies/catalog/*.yaml", "studies/sweeps/*.py")  # the catalog; the validate sweeps, one file per axis


def readme_file_map() -> dict[str, str]:
    """The README's `## Files` section: its ```text block, one `path  description` line per file."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Files", 1)
    assert len(section) == 2, "README.md has no `## Files` section"
    block = re.search(r"^```text\n(.*?)^```$", section[1], re.M | re.S)
    assert block, "README.md's `## Files` section has no ```text block"
    entries = {}
    for line in block.group(1).splitlines():
        path, _, description = line.partition("  ")
        entries[path.strip()] = description.strip()
    return entries


def test_the_readme_file_map_lists_every_production_file_once_with_a_description():
    entries = readme_file_map()
    actual = production_files()
    missing, stale = sorted(actual - set(entries)), sorted(set(entries) - actual)
    assert not missing and not stale, (
        "README.md's file map is out of date (`## Files`: one line per file, `path  the first line of its docstring`)"
        f"; add {missing}; remove {stale}")
    assert all(entries.values()), [path for path, d in entries.items() if not d]


def test_the_readme_stays_a_summary():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines: keep it a summary (~200 lines) and move "
                                       "detail to the docs/ page of its topic")


def test_the_readme_keeps_the_two_setup_commands_and_links_every_docs_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```bash\nmake demo\n```" in text and "```bash\nmake test\n```" in text
    linked = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in linked]
    assert not unlinked, f"README.md links no {unlinked}: add a line to its `## Docs` list"


# ------------------------------------------------------------------------------------------------ docs/studies.md


def test_docs_studies_lists_every_catalog_spec():
    text = (ROOT / "docs" / "studies.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((ROOT / "studies" / "catalog").glob("*.yaml"))
               if f"`studies/catalog/{p.name}`" not in text]
    assert not missing, f"docs/studies.md's catalog table lacks {missing}"


def _field(model: Any, dotted: str) -> bool:
    """Whether `a.b.c` names a field of the pydantic model (by name or alias), through nested models."""
    import typing

    from pydantic import BaseModel

    head, _, rest = dotted.partition(".")
    fields = {f.alias or name: f for name, f in model.model_fields.items()} | dict(model.model_fields)
    if head not in fields:
        return False
    if not rest:
        return True
    annotation = fields[head].annotation
    candidates = [annotation, *typing.get_args(annotation)]
    for inner in list(candidates):
        candidates += typing.get_args(inner)
    return any(isinstance(c, type) and issubclass(c, BaseModel) and _field(c, rest) for c in candidates)


def test_docs_studies_spec_table_names_only_real_fields():
    from studies import StudySpec

    text = (ROOT / "docs" / "studies.md").read_text(encoding="utf-8")
    table = re.search(r"^\| field \| default \| meaning \|\n\|[-| ]+\|\n((?:\|.*\n)+)", text, re.M)
    assert table, "docs/studies.md has no `| field | default | meaning |` table of the spec's fields"
    named = [name for row in table.group(1).splitlines() for name in re.findall(r"`([\w.]+)`", row.split("|")[1])]
    assert len(named) > 50, named
    unknown = [name for name in named if not _field(StudySpec, name)]
    assert not unknown, f"docs/studies.md names spec fields StudySpec does not have: {unknown}"


# ------------------------------------------------------------------------------------------------ settings


def test_every_ptctl_setting_the_docs_name_exists_in_the_code():
    code = "\n".join(p.read_text(encoding="utf-8") for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    code += (ROOT / "Makefile").read_text(encoding="utf-8") + (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    from service.limits import Limits

    prefix = Limits.model_config.get("env_prefix", "")
    code += " ".join(f"{prefix}{name}".upper() for name in Limits.model_fields)  # pydantic-settings' env names
    named = {m for page in PAGES for m in re.findall(r"\bPTCTL_[A-Z0-9_]*[A-Z0-9]\b", page.read_text(encoding="utf-8"))}
    assert named
    unknown = sorted(name for name in named if name not in code)
    assert not unknown, f"the docs name settings no code reads: {unknown}"
