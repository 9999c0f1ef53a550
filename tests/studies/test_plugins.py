"""Families from installed packages (`studies.family.load_plugins`): a distribution with an entry point in the group
`ptctl.families` adds a family everywhere the built-ins appear; a broken one is skipped with one warning naming its
distribution, and the other families keep working; the service's allow-list (`PTCTL_FAMILIES`) narrows what a remote
spec may name.

Each installed-plugin case is a throwaway distribution in a temporary folder (a module and its `.dist-info` with
`entry_points.txt`), put on the `PYTHONPATH` of a fresh interpreter, where `import studies` discovers it. The plugin
family `tinygpt` is TauGPT's registration under a new name, so it needs no model of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from service.policy import RemotePolicy
from service.settings import Settings
from studies import load_catalog
from studies.family import ENTRY_POINT_GROUP

REPO = Path(__file__).parents[2]
BUILT_IN = ["pt", "bert", "ut", "tauformer", "hf"]
INSTALLED = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))  # the example's (`make install`)
WITH_TINY = BUILT_IN + sorted([*INSTALLED, "tinygpt"])  # plugins register in entry point name order

TINYGPT = """
    import dataclasses

    from studies.families.tauformer import FAMILY as TAU
    from studies.family import Family

    FAMILY: Family = dataclasses.replace(TAU, name="tinygpt")
"""


def _distribution(site: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    """An installed distribution `dist` 0.1 in `site`: `module`.py holding `source`, its entry points declared."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


def _python(site: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PTCTL_FAMILIES"}
    environ.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), **env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def site(tmp_path) -> Path:
    path = tmp_path / "site"
    path.mkdir()
    _distribution(path, "tinygpt-plugin", "tinygpt_plugin", TINYGPT, {"tinygpt": "tinygpt_plugin:FAMILY"})
    return path


def test_an_installed_plugin_family_appears_everywhere_the_built_ins_do(site, tmp_path, migrated):
    for name in ("open", "narrow"):  # the two apps' data directories, their MLflow stores ready
        migrated(tmp_path / name)
    out = _python(site, f"""
        import contextlib, copy, io, json
        from fastapi.testclient import TestClient

        from service.app import create_app
        from service.cli import build_parser
        from service.settings import Settings
        from studies import StudySpec, family_names, load_catalog
        from studies.model import ModelSpec
        from studies.family import PLUGINS
        from tests.service.conftest import FakeExecutor
        from workers.models import model_class

        spec = copy.deepcopy(load_catalog("tiny_tau").as_dict())
        spec["model"]["family"] = "tinygpt"
        study = StudySpec.model_validate(spec)
        yaml_file = {str(tmp_path / "study.yaml")!r}
        open(yaml_file, "w").write(study.to_yaml())
        from_yaml = StudySpec.from_yaml(yaml_file)
        try:
            ModelSpec(family="nope")
        except ValueError as exc:
            unknown = str(exc)

        chosen = build_parser().parse_args(["coord-check", "--model", "tinygpt"]).model
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
            build_parser().parse_args(["coord-check", "--help"])

        def post(settings, *bodies):
            with TestClient(create_app(settings, FakeExecutor()), raise_server_exceptions=False) as client:
                answers = [client.post("/studies", content=json.dumps(body),
                                       headers={{"Content-Type": "application/json"}}) for body in bodies]
                return client.get("/openapi.json").json(), [(a.status_code, a.json()) for a in answers]

        openapi, [(accepted, _)] = post(Settings(data_dir={str(tmp_path / "open")!r}, families=None), spec)
        _, [(refused, refusal), (pt_status, _)] = post(Settings(data_dir={str(tmp_path / "narrow")!r}),  # the env's
                                                       spec, load_catalog("tiny").as_dict())
        variants = openapi["components"]["schemas"]["StudySpec"]["oneOf"]
        print(json.dumps({{
            "names": family_names(), "plugins": PLUGINS, "family": study.model.family,
            "from_yaml": from_yaml.model.family, "unknown": unknown,
            "chosen": chosen, "help": shown.getvalue(),
            "variants": [v["properties"]["model"]["properties"]["family"]["const"] for v in variants],
            "accepted": accepted, "refused": refused, "refusal": refusal, "pt_status": pt_status,
            "model_class": model_class("tinygpt").__name__,
        }}))
    """, PTCTL_FAMILIES="pt,bert")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["names"] == WITH_TINY
    assert got["plugins"]["tinygpt"] == "tinygpt-plugin 0.1" and set(got["plugins"]) == {*INSTALLED, "tinygpt"}
    assert got["family"] == got["from_yaml"] == "tinygpt"
    assert f"choose one of {WITH_TINY}" in got["unknown"]
    assert got["chosen"] == "tinygpt"  # ptctl coord-check --model tinygpt
    assert f"one of {', '.join(WITH_TINY)}" in " ".join(got["help"].split())
    assert got["variants"] == got["names"]  # the request schema: one variant per family
    assert got["model_class"] == "TauGPT"  # the workers build it from the registration
    assert got["accepted"] == 201 and got["pt_status"] == 201
    assert got["refused"] == 422, got["refusal"]
    [violation] = got["refusal"]["detail"]
    assert violation["loc"] == ["body", "model", "family"]
    assert "'tinygpt'" in violation["msg"] and "PTCTL_FAMILIES=pt,bert" in violation["msg"]
    assert "ptctl plugin" not in out.stderr, out.stderr


def test_broken_plugins_are_skipped_with_one_warning_each(site):
    _distribution(site, "broken-import", "broken_import_plugin", "raise ImportError(\"No module named 'flash_x'\")\n",
                  {"brokenimp": "broken_import_plugin:FAMILY"})
    _distribution(site, "wrong-object", "wrong_object_plugin", "FAMILY = {'name': 'wrongobj'}\n",
                  {"wrongobj": "wrong_object_plugin:FAMILY"})
    _distribution(site, "shadow-pt", "shadow_plugin", """
        import dataclasses

        from studies.families.tauformer import FAMILY as TAU
        from studies.family import register

        register(dataclasses.replace(TAU, name="bert"))  # replaced behind the loader's back: undone
        FAMILY = dataclasses.replace(TAU, name="pt")
    """, {"pt": "shadow_plugin:FAMILY"})
    _distribution(site, "misnamed", "misnamed_plugin", TINYGPT, {"tiny": "misnamed_plugin:FAMILY"})
    out = _python(site, """
        import json

        import studies
        from studies import StudySpec, family_names, get_family, load_catalog, load_plugins
        from studies.family import FAMILIES
        from workers.models import family

        load_plugins()  # once per process: no second warning
        StudySpec.model_json_schema()
        try:
            get_family("brokenimp")
        except ValueError as exc:
            broken = str(exc)
        try:
            family("wrongobj")
        except ValueError as exc:
            wrong = str(exc)
        print(json.dumps({
            "names": family_names(), "tiny": load_catalog("tiny").model.family,
            "pt": FAMILIES["pt"].arch.__module__, "bert": FAMILIES["bert"].arch.__module__,
            "broken": broken, "wrong": wrong,
        }))
    """)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["names"] == WITH_TINY  # the good plugin too
    assert got["tiny"] == "pt"
    assert (got["pt"], got["bert"]) == ("studies.families.pt", "studies.families.bert")
    warnings = [line for line in out.stderr.splitlines() if line.startswith("ptctl plugin")]
    assert len(warnings) == 4, out.stderr
    by_dist = {d: [w for w in warnings if f"distribution {d} 0.1" in w] for d in
               ("broken-import", "wrong-object", "shadow-pt", "misnamed")}
    assert all(len(ws) == 1 for ws in by_dist.values()), by_dist
    [imp], [obj], [shadow], [misnamed] = by_dist.values()
    assert "ImportError: No module named 'flash_x'" in imp and "pip uninstall broken-import" in imp
    assert "gave a dict, not a studies.family.Family" in obj and "pip uninstall wrong-object" in obj
    assert "'pt' is already a built-in family's" in shadow and "may not replace" in shadow
    assert "named 'tinygpt', not 'tiny'" in misnamed and 'tinygpt = "misnamed_plugin:FAMILY"' in misnamed
    assert "broken-import 0.1, which failed to load" in got["broken"]
    assert "wrong-object 0.1" in got["wrong"]


def test_a_family_missing_on_a_worker_says_to_install_its_package():
    from workers.errors import ConfigError
    from workers.models import family

    with pytest.raises(ConfigError) as err:
        family("tinygpt")
    message = str(err.value)
    assert message.startswith("unknown model family 'tinygpt': choose one of ['pt', 'bert', 'ut', 'tauformer'")
    assert "must be installed in this Python environment: on a Ray cluster, on every node" in message
    assert ENTRY_POINT_GROUP in message


@pytest.mark.parametrize(("allowed", "refused"), [(None, []), ("pt,bert", ["tauformer"]), ("tauformer", [])])
def test_the_allow_list_narrows_the_families_a_remote_spec_names(tmp_path, allowed, refused):
    spec = load_catalog("tiny_tau")
    found = RemotePolicy(Settings(data_dir=tmp_path, families=allowed)).violations(spec)
    assert [v.loc for v in found] == [("model", "family")] * len(refused)
    if refused:
        assert found[0].msg.startswith("model family 'tauformer' is not one this service accepts")
        assert f"PTCTL_FAMILIES={allowed}" in found[0].msg


def test_the_allow_list_reads_a_comma_separated_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("PTCTL_FAMILIES", " pt , bert,")
    assert Settings(data_dir=tmp_path).families == ["pt", "bert"]
    monkeypatch.setenv("PTCTL_FAMILIES", "")
    assert Settings(data_dir=tmp_path).families is None



WORKERS_FIRST = """
    import dataclasses

    from studies.families.tauformer import FAMILY as TAU
    from workers.models.contract import LanguageModel  # noqa: F401  a plugin that imports ptctl's workers at the top

    FAMILY = dataclasses.replace(TAU, name="wgpt")
"""


@pytest.mark.parametrize("first", ["workers.errors", "wgpt_plugin"])
def test_a_plugin_registers_whichever_module_a_process_imports_first(tmp_path, first):
    """`ptctl train` imports `workers.errors` first; a user's script (or a process unpickling its config) may
    import the plugin's own module first: either way the family registers, without a warning."""
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, "wgpt-plugin", "wgpt_plugin", WORKERS_FIRST, {"wgpt": "wgpt_plugin:FAMILY"})
    done = _python(site, f"""
        import {first}
        from studies.family import family_names, get_family
        print(get_family("wgpt").name, "wgpt" in family_names())
    """)
    assert done.stdout.split() == ["wgpt", "True"], done.stdout
    assert "skipped" not in done.stderr, done.stderr
