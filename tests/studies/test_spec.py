"""StudySpec: the catalog, YAML round trips, the content hash, validation messages, trial configs."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

import studies
from studies.families.pt import HPARAMS, PTConfig
from studies.phases import phases_of
from studies.phases.validate import validate_trials
from studies.spec import CATALOG_DIR, StudySpec, TrialConfig, VerifySpec
from studies.sweeps import SWEEPS
from tests.studies._dicts import with_changes

CATALOG = sorted(CATALOG_DIR.glob("*.yaml"))
MINIMAL = {"name": "demo", "tune": {"base_width": 16, "asha": {"grace_steps": 10}},
           "transfer": {"widths": [32, 64]}}
HP = {"lr": 3e-3, "w_H": 2.0, "w_topic": 0.5, "w_unary": 1.5, "w_dep": 0.75, "w_head": 1.25, "w_topic_z": 3.0}


def spec_dict(**changes: object) -> dict:
    """MINIMAL with dotted-path changes, e.g. spec_dict(**{"verify.delta": 0.3})."""
    return with_changes(MINIMAL, **changes)


def error_of(data: dict) -> str:
    with pytest.raises(ValidationError) as err:
        StudySpec.model_validate(data)
    return str(err.value)


def reversed_keys(value: object) -> object:
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


# ------------------------------------------------------------------------------------ catalog
def test_catalog_has_the_three_studies():
    assert {p.stem for p in CATALOG} >= {"tiny", "cpu_demo", "paper_pt_minipile"}
    assert studies.catalog_names() == [p.stem for p in CATALOG]


@pytest.mark.parametrize("path", CATALOG, ids=lambda p: p.stem)
def test_every_catalog_file_validates_and_round_trips(path: Path):
    spec = StudySpec.from_yaml(path)
    assert spec == StudySpec.from_yaml(path.read_text(encoding="utf-8"))
    assert StudySpec.from_yaml(spec.to_yaml()) == spec


def test_tiny_is_ci_sized():
    spec = studies.load_catalog("tiny")
    assert (spec.tune.base_width, spec.transfer.widths, spec.verify_width()) == (16, [32], 32)
    assert (spec.train.steps, spec.train.batch_size) == (30, 16)
    assert (spec.data.seq_len, spec.data.max_tokens) == (32, 60000)
    assert (spec.tune.num_trials, spec.tune.max_concurrent, spec.tune.asha.grace_steps) == (6, 2, 10)
    assert spec.verify.resolved_n_samples() == 6 and spec.validate_ is None


def pt_params(d: int, vocab: int, arch, base_width: int) -> int:
    """PT's parameter count: S |V|·d, decoder |V|·d + |V|, U and V 2·K·h·d·r, topics B m·d."""
    k = 2 * arch.gamma + 2 if arch.gamma else 1
    h = arch.n_channels * d // base_width if arch.paradigm == "channels" else arch.n_channels
    r = arch.rank * d // base_width if arch.paradigm == "rank" else arch.rank
    m = arch.n_topics * d // base_width if arch.topic != "none" else 0
    return 2 * vocab * d + vocab + 2 * k * h * d * r + m * d


def test_paper_study_spans_17m_to_0_4b_parameters():
    spec = studies.load_catalog("paper_pt_minipile")
    arch, base, vocab = spec.model.arch, spec.tune.base_width, spec.data.vocab_size
    assert (spec.data.source, spec.data.path) == ("hf", "JeanKaddour/minipile")
    assert (vocab, spec.data.seq_len, spec.data.tokenizer) == (30522, 512, "wordpiece")
    assert 16.5e6 < pt_params(base, vocab, arch, base) < 17.5e6
    assert 0.35e9 < pt_params(max(spec.transfer.widths), vocab, arch, base) < 0.45e9
    assert spec.verify.resolved_n_samples() == 62
    assert spec.resources.gpus_per_trial == 0.25 and spec.resources.transfer_gpus == 1
    assert spec.validate_ is not None


def test_load_catalog_names_the_choices_when_unknown():
    with pytest.raises(ValueError, match=r"no catalog study 'nope'.*tiny"):
        studies.load_catalog("nope")


# ------------------------------------------------------------------------------------ yaml, hash
def test_round_trip_with_every_section_set():
    spec = StudySpec.model_validate(spec_dict(
        validate={"widths": [16, 32], "lrs": [0.1, 0.01, 0.001]},
        **{"verify.tolerance": 0.004, "space.frozen": ["w_topic"], "resources.transfer_gpus": 1}))
    text = spec.to_yaml()
    assert "\nvalidate:\n" in text and "validate_" not in text
    again = StudySpec.from_yaml(text)
    assert again == spec
    assert again.validate_.lrs == [0.001, 0.01, 0.1]
    assert again.verify.tolerance == 0.004
    noise = StudySpec.model_validate(spec_dict(**{"verify.tolerance": "seed_noise"}))
    assert StudySpec.from_yaml(noise.to_yaml()).verify.tolerance == "seed_noise"
    assert StudySpec.model_validate(MINIMAL).verify.tolerance == "seed_spread"  # the default (and study ids) stay


def test_content_hash_is_stable_under_key_order_and_changes_with_a_value():
    data = spec_dict(**{"verify.delta": 0.3, "data.seq_len": 48})
    spec = StudySpec.model_validate(data)
    assert re.fullmatch(r"[0-9a-f]{64}", spec.content_hash())
    assert StudySpec.model_validate(reversed_keys(data)).content_hash() == spec.content_hash()
    assert StudySpec.from_yaml(spec.to_yaml()).content_hash() == spec.content_hash()
    changed = StudySpec.model_validate(spec_dict(**{"verify.delta": 0.31, "data.seq_len": 48}))
    assert changed.content_hash() != spec.content_hash()


def test_content_hash_is_sha256_of_the_sorted_compact_json():
    spec = StudySpec.model_validate(MINIMAL)
    data = spec.as_dict()
    data["resources"].pop("max_retries")  # how faults are handled and where checkpoints go, not what is computed
    data["resources"].pop("checkpoint_every_s")
    data["resources"].pop("storage")
    data["resources"].pop("batch_members")  # how trials are packed into processes
    data["resources"].pop("runner")  # and where (Ray, or this process)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert spec.content_hash() == hashlib.sha256(canonical.encode()).hexdigest()


def test_the_runner_keeps_the_study_id_and_takes_ray_or_local():
    spec = StudySpec.model_validate(MINIMAL)
    assert spec.resources.runner == "ray"
    local = StudySpec.model_validate({**MINIMAL, "resources": {"runner": "local"}})
    assert local.resources.runner == "local" and local.content_hash() == spec.content_hash()
    with pytest.raises(ValidationError, match="'ray' or 'local'"):
        StudySpec.model_validate({**MINIMAL, "resources": {"runner": "slurm"}})


def test_batch_members_keeps_the_study_id_and_takes_auto_or_a_positive_integer():
    spec = StudySpec.model_validate(MINIMAL)
    assert spec.resources.batch_members == "auto"
    for members in (1, 16):
        data = spec.as_dict()
        data["resources"]["batch_members"] = members
        assert StudySpec.model_validate(data).content_hash() == spec.content_hash()
    for bad in (0, -2, "many"):
        data = spec.as_dict()
        data["resources"]["batch_members"] = bad
        with pytest.raises(ValueError, match="batch_members"):
            StudySpec.model_validate(data)


def test_max_retries_has_a_bounded_default_and_keeps_the_study_id():
    spec = StudySpec.model_validate(MINIMAL)
    assert spec.resources.max_retries == 2
    retried = StudySpec.model_validate(spec_dict(**{"resources.max_retries": 5}))
    assert retried.resources.max_retries == 5 and retried.content_hash() == spec.content_hash()
    assert spec.resources.checkpoint_every_s == 30
    rarer = StudySpec.model_validate(spec_dict(**{"resources.checkpoint_every_s": 0}))
    assert rarer.content_hash() == spec.content_hash()
    with pytest.raises(ValidationError, match="max_retries"):
        StudySpec.model_validate(spec_dict(**{"resources.max_retries": 11}))


def test_explicit_defaults_hash_like_omitted_ones():
    explicit = StudySpec.model_validate(spec_dict(**{"tune.num_trials": 16, "verify.p": 0.05}))
    assert explicit.content_hash() == StudySpec.model_validate(MINIMAL).content_hash()


def test_from_yaml_reads_a_path_string_and_reports_a_missing_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(StudySpec.model_validate(MINIMAL).to_yaml())
    assert StudySpec.from_yaml(str(path)) == StudySpec.model_validate(MINIMAL)
    with pytest.raises(FileNotFoundError, match="no spec file"):
        StudySpec.from_yaml(str(tmp_path / "missing.yaml"))


def test_spec_is_frozen():
    spec = StudySpec.model_validate(MINIMAL)
    with pytest.raises(ValidationError):
        spec.name = "other"
    assert spec.model_copy(update={"name": "other"}).name == "other"


# ------------------------------------------------------------------------------------ invalid specs
@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"transfer.widths": [-32]}, "transfer.widths.0"),
        ({"transfer.widths": [32, 0]}, "transfer.widths.1"),
        ({"tune.base_width": -16}, "tune.base_width"),
        ({"verify.width": -64}, "verify.width"),
    ],
)
def test_negative_or_zero_width(changes, path):
    message = error_of(spec_dict(**changes))
    assert path in message and "greater than 0" in message


@pytest.mark.parametrize("widths", [[16], [8, 32], [32, 16]])
def test_transfer_width_not_above_base_width(widths):
    message = error_of(spec_dict(**{"transfer.widths": widths}))
    assert "transfer.widths" in message
    if widths != [32, 16]:  # [32, 16] fails as not increasing
        assert "must be > tune.base_width=16" in message


def test_transfer_widths_must_increase():
    assert "strictly increasing" in error_of(spec_dict(**{"transfer.widths": [64, 32]}))


def test_verify_width_below_base_width():
    assert "verify.width=8 must be >= tune.base_width=16" in error_of(spec_dict(**{"verify.width": 8}))


def test_unknown_model_family():
    message = error_of(spec_dict(**{"model.family": "gpt"}))
    assert "model.family" in message and all(f"'{f}'" in message for f in ("pt", "bert", "ut"))


def test_unknown_hparam_in_space_lists_the_valid_ones():
    message = error_of(spec_dict(**{"space.w_bogus": {"low": 0.5, "high": 2}}))
    assert re.search(r"^space$", message, re.M) and "w_bogus" in message and "w_topic_z" in message


@pytest.mark.parametrize("delta", [0, 1, 1.5, -0.5])
def test_delta_outside_the_open_unit_interval(delta):
    assert "verify.delta" in error_of(spec_dict(**{"verify.delta": delta}))


def test_delta_inside_is_accepted():
    assert StudySpec.model_validate(spec_dict(**{"verify.delta": 0.99})).verify.delta == 0.99


def test_unknown_top_level_key():
    message = error_of(spec_dict(bogus=1))
    assert re.search(r"^bogus$", message, re.M) and "Extra inputs are not permitted" in message


NESTED = ["model.arch.n_head", "train.lr", "tune.asha.grace", "resources.tracking.uri", "space.lr.step"]


@pytest.mark.parametrize("path", NESTED)
def test_unknown_nested_key(path):
    message = error_of(spec_dict(**{path: 1}))
    assert re.search(rf"^{re.escape(path)}$", message, re.M) and "Extra inputs" in message


@pytest.mark.parametrize(
    ("changes", "where", "offender"),
    [
        ({"model.arch.n_channels": 3, "transfer.widths": [24]}, "transfer.widths[0]=24", "n_channels=3"),
        ({"model.arch.n_channels": 2, "transfer.widths": [32, 36]}, "transfer.widths[1]=36", "n_channels=2"),
        ({"model.arch.paradigm": "rank", "model.arch.rank": 3, "transfer.widths": [24]}, "transfer.widths[0]",
         "rank=3"),
        ({"model.arch.topic": "single_split", "model.arch.n_topics": 6, "transfer.widths": [20]},
         "transfer.widths[0]=20", "n_topics=6"),
        ({"model.arch.n_channels": 3, "verify.width": 24}, "verify.width=24", "n_channels=3"),
        ({"model.arch.n_channels": 3, "validate": {"widths": [16, 24], "lrs": [0.1, 0.01, 0.001]}},
         "validate.widths[1]=24", "n_channels=3"),
    ],
)
def test_width_incompatible_with_the_paradigm(changes, where, offender):
    message = error_of(spec_dict(**changes))
    assert where in message and f"model.arch.{offender}" in message and "multiples of" in message


def test_compatible_widths_pass():
    spec = StudySpec.model_validate(spec_dict(**{"model.arch.n_channels": 2, "transfer.widths": [24, 40]}))
    assert spec.transfer.widths == [24, 40]


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"name": "My Study"}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"model.arch.root": True}, "root-node variant"),
        ({"model.arch.decomposition": "uvw"}, "μP is specified for 'uv' only"),
        ({"data.source": "text"}, "data.path is required"),
        ({"data.path": "x.txt"}, "data.path must be empty"),
        ({"data.mask_rate": 1.0}, "data.mask_rate"),
        ({"data.source": "csv", "data.path": "x"}, "data.source"),
        ({"data.streaming": True}, "data.streaming needs source jsonl"),
        ({"data.source": "text", "data.path": "c.txt", "data.streaming": True}, "set source: jsonl"),
        ({"data.stream_val_every": 1}, "data.stream_val_every=1"),
        ({"data.stream_val_every": -1}, "data.stream_val_every"),
        ({"data.objective": "causal"}, "data.objective"),
        ({"tune.asha.grace_steps": 500}, "tune.asha.grace_steps=500 exceeds"),
        ({"train.warmup_steps": 300}, "train.warmup_steps=300 must be <"),
        ({"verify.centre_seeds": 1}, "needs verify.centre_seeds >= 2"),
        ({"verify.centre_seeds": 1, "verify.tolerance": "seed_noise"}, "'seed_noise' needs verify.centre_seeds >= 2"),
        ({"verify.tolerance": 1.5}, "verify.tolerance"),
        ({"verify.tolerance": "seed-spread"}, "verify.tolerance"),
        ({"resources.gpus_per_trial": 1.5}, "resources.gpus_per_trial=1.5"),
        ({"validate": {"widths": [16, 32], "lrs": [0.1, 0.01]}}, "validate.lrs"),
        ({"validate": {"widths": [16, 32], "lrs": [0.1, 0.01, 0.01]}}, "must be distinct"),
        ({"validate": {"widths": [16, 32], "lrs": [1, 2, 3], "parametrizations": ["standard"]}},
         "include 'mup'"),
        ({"validate": {"widths": [16], "lrs": [1, 2, 3]}}, "validate.widths"),
        ({"validate": {"widths": [16, 32, 48, 64, 80], "lrs": [1, 2, 3]}}, "validate.widths"),
        ({"model.parametrization": "standard", "model.arch.decomposition": "uvw",
          "validate": {"widths": [16, 32], "lrs": [1, 2, 3]}}, "validate runs mup, which this model cannot"),
        ({"data": None}, "data\n  Input should be a valid dictionary"),
        ({"validate_": {"widths": [16, 32], "lrs": [1, 2, 3]}}, "validate_\n  Extra inputs are not permitted"),
    ],
)
def test_other_invalid_specs_name_the_field(changes, needle):
    assert needle in error_of(spec_dict(**changes))


def test_fractional_gpus_below_one_and_whole_gpus_pass():
    changes = {"resources.gpus_per_trial": 0.25, "resources.transfer_gpus": 2}
    spec = StudySpec.model_validate(spec_dict(**changes))
    assert (spec.resources.gpus_per_trial, spec.resources.transfer_gpus) == (0.25, 2)


# ------------------------------------------------------------------------------------ resolved values
def test_default_n_samples_is_59():
    assert VerifySpec().resolved_n_samples() == 59
    assert StudySpec.model_validate(MINIMAL).verify.resolved_n_samples() == 59
    assert VerifySpec(p=0.1, alpha=0.05).resolved_n_samples() == 29  # ceil(ln 0.05 / ln 0.9) = ceil(28.43)


def test_resolved_defaults():
    spec = StudySpec.model_validate(spec_dict(**{"tune.steps": 50, "verify.steps": 70}))
    assert spec.verify_width() == 64
    assert spec.experiment_name() == "demo"
    assert [spec.steps_for(p) for p in ("tune", "transfer", "verify")] == [50, 200, 70]
    assert phases_of(spec) == ["tune", "transfer", "verify"]
    assert phases_of(StudySpec.model_validate(spec_dict(verify=None))) == ["tune", "transfer"]
    assert spec.steps_for("probe") == spec.train.steps  # a phase without a section of its own


# ------------------------------------------------------------------------------------ trial config
def test_trial_config_splits_the_hparams():
    spec = StudySpec.model_validate(MINIMAL)
    cfg = spec.trial_config(32, HP, seed=7)
    assert cfg["lr"] == HP["lr"] and "lr" not in cfg["model_hp"]
    assert {k: cfg["model_hp"][k] for k in HP if k != "lr"} == {k: v for k, v in HP.items() if k != "lr"}
    assert not set(HP) - {"lr"} & set(cfg)
    assert (cfg["model"], cfg["seed"], cfg["steps"]) == ("pt", 7, 200)
    assert (cfg["model_hp"]["width"], cfg["model_hp"]["base_width"], cfg["model_hp"]["parametrization"]) == (
        32, 16, "mup")


def test_trial_config_is_what_the_worker_validates():
    spec = StudySpec.model_validate(MINIMAL)
    trial = TrialConfig.model_validate(spec.trial_config(32, HP, seed=0))
    assert (trial.data, trial.lr, trial.steps) == (spec.data, HP["lr"], spec.train.steps)
    model = PTConfig(vocab_size=100, **trial.model_hp)  # every key is one of the model config's, none missing
    assert (model.width, model.base_width, model.parametrization, model.w_H) == (32, 16, "mup", HP["w_H"])
    assert set(trial.model_hp) == set(PTConfig.model_fields) - {"vocab_size"}


def test_trial_config_fills_frozen_and_missing_hparams_with_defaults():
    spec = StudySpec.model_validate(spec_dict(
        **{"space.frozen": ["w_topic"], "space.w_topic": {"low": 0.5, "high": 2, "default": 0.6}}))
    cfg = spec.trial_config(32, {"lr": 0.02}, seed=0, steps=12, parametrization="standard")
    assert (cfg["lr"], cfg["steps"], cfg["model_hp"]["parametrization"]) == (0.02, 12, "standard")
    assert cfg["model_hp"]["w_topic"] == 0.6 and cfg["model_hp"]["w_H"] == 1.0


def test_trial_config_rejects_unknown_hparams_and_bad_widths():
    spec = StudySpec.model_validate(spec_dict(**{"model.arch.n_channels": 2}))
    with pytest.raises(ValueError, match=r"unknown hparam\(s\) \['momentum'\]"):
        spec.trial_config(32, {"momentum": 0.9}, seed=0)
    with pytest.raises(ValueError, match="width=20 is incompatible"):
        spec.model_hp(20, {})
    with pytest.raises(ValueError, match="parametrization 'sp'"):
        spec.model_hp(32, {}, parametrization="sp")


def test_every_hparam_lands_exactly_once():
    cfg = StudySpec.model_validate(MINIMAL).trial_config(32, HP, seed=0)
    where = (("top", cfg), ("model_hp", cfg["model_hp"]))
    places = {h: [name for name, d in where if h in d] for h in HPARAMS}
    assert places == {h: ["top"] if h == "lr" else ["model_hp"] for h in HPARAMS}


def test_storage_is_a_path_every_node_mounts_or_an_s3_uri_and_not_part_of_the_study():
    spec = studies.load_catalog("tiny")
    for where in ("/mnt/nfs/ptctl", "s3://lab-bucket/ptctl"):
        moved = StudySpec.model_validate(with_changes(spec.as_dict(), resources={"storage": where}))
        assert moved.resources.storage == where and moved.content_hash() == spec.content_hash()
    for bad in ("relative/dir", "s3://", "gs://bucket/x"):
        with pytest.raises(ValidationError, match="resources.storage=.*absolute path that every Ray node mounts"):
            StudySpec.model_validate(with_changes(spec.as_dict(), resources={"storage": bad}))


# ------------------------------------------------------------------------------------ the horizon (validate.steps)


def test_catalog_specs_hash_as_before_the_horizon_sweep():
    """validate.steps took one int before lists were allowed; an int spec dumps and hashes as it did (these hashes
    were recorded before the change)."""
    assert StudySpec.from_yaml(CATALOG_DIR / "cpu_demo.yaml").content_hash().startswith("e48352ede783")
    assert StudySpec.from_yaml(CATALOG_DIR / "pt_lr_alignment.yaml").content_hash().startswith("b64143c9a7f1")
    one = StudySpec.model_validate(spec_dict(validate={"widths": [16, 32], "lrs": [1, 2, 3], "steps": 100}))
    assert one.as_dict()["validate"]["steps"] == 100 and one.validate_.horizons() == []
    assert one.steps_for("validate") == 100 and one.validate_horizon() == 100


def test_a_list_of_validate_steps_is_a_horizon_sweep():
    listed = StudySpec.model_validate(spec_dict(**{"train.steps": 300},
                                                validate={"widths": [32], "lrs": [1, 2, 3], "steps": [150, 300, 600]}))
    assert listed.validate_.horizons() == [150, 300, 600]
    assert listed.validate_horizon() == 300  # train.steps is listed: the width sweep's and the regret's length
    longest = StudySpec.model_validate(spec_dict(validate={"widths": [32, 64], "lrs": [1, 2, 3], "steps": [50, 100]}))
    assert longest.validate_horizon() == 100 and longest.steps_for("validate") == 100


@pytest.mark.parametrize(
    ("steps", "needle"),
    [
        ([300], "2–4 strictly increasing"),
        ([100, 200, 300, 400, 500], "2–4 strictly increasing"),
        ([300, 150], "2–4 strictly increasing"),
        ([150, 150], "2–4 strictly increasing"),
        ([0, 150], "validate.steps.list[constrained-int].0\n  Input should be greater than 0"),
        ([5, 150], "validate.steps[0]=5"),  # train.warmup_steps 10 needs more
    ],
)
def test_invalid_validate_steps_name_the_field(steps, needle):
    message = error_of(spec_dict(validate={"widths": [16, 32], "lrs": [1, 2, 3], "steps": steps}))
    assert "validate" in message and needle in message


def test_one_validate_width_only_with_a_horizon_sweep():
    assert "or one width with validate.steps" in error_of(spec_dict(validate={"widths": [32],
                                                                                        "lrs": [1, 2, 3]}))
    assert "validate.hparams need 2–4 validate.widths" in error_of(spec_dict(validate={
        "widths": [32], "lrs": [1, 2, 3], "steps": [50, 100], "hparams": {"w_H": [1, 2, 4]}}))


def test_the_horizon_catalog_study_is_cpu_sized():
    spec = studies.load_catalog("horizon_cpu")
    assert phases_of(spec) == ["tune", "validate"] and spec.validate_.horizons() == [150, 300, 600]
    assert spec.steps_for("tune") < spec.train.steps == spec.validate_horizon()
    assert len(validate_trials(spec, spec.space.defaults())) <= 40 and spec.train.device == "cpu"


# ------------------------------------------------------------------------------------ the depth sweep (validate.depths)
TAU = {"name": "deep", "model": {"family": "tauformer", "arch": {"head_dim": 16, "max_len": 64, "n_layers": 2,
                                                                  "depth_parametrization": "completep",
                                                                  "base_depth": 2}},
       "data": {"seq_len": 64}, "tune": {"base_width": 32, "asha": {"grace_steps": 10}}, "transfer": None,
       "verify": None, "validate": {"widths": [32], "lrs": [0.001, 0.01, 0.1], "depths": [2, 4, 8]}}


def test_a_spec_without_depths_dumps_and_hashes_as_before():
    """Leaving validate.depths out keeps it out of the dump (the pinned hashes above hold); giving it changes both."""
    plain = StudySpec.from_yaml(CATALOG_DIR / "pt_lr_alignment.yaml")
    assert "depths" not in plain.as_dict()["validate"] and SWEEPS["depth"].trials(plain, plain.space.defaults()) == []
    deep = StudySpec.model_validate(TAU)
    assert deep.as_dict()["validate"]["depths"] == [2, 4, 8]
    assert StudySpec.from_yaml(deep.to_yaml()) == deep
    shallower = StudySpec.model_validate(with_changes(TAU, **{"validate.depths": [2, 4]}))
    assert deep.content_hash() != shallower.content_hash()
    # completep and none × 3 depths × 3 lrs; one width: no width sweep
    assert len(validate_trials(deep, deep.space.defaults())) == 2 * 3 * 3


@pytest.mark.parametrize(("depths", "needle"), [
    ([4], "give 2–4 strictly increasing depths"),
    ([2, 4, 8, 16, 32], "give 2–4 strictly increasing depths"),
    ([4, 2], "give 2–4 strictly increasing depths"),
    ([2, 2], "give 2–4 strictly increasing depths"),
    ([0, 2], "greater than 0"),
])
def test_invalid_validate_depths_name_the_field(depths, needle):
    error = error_of(with_changes(TAU, **{"validate.depths": depths}))
    assert "validate.depths" in error and needle in error


def test_validate_depths_need_a_family_with_a_depth_at_completep():
    pt = error_of(spec_dict(validate={"widths": [16], "lrs": [0.001, 0.01, 0.1], "depths": [2, 4]}))
    assert "validate.depths=[2, 4]: model.family 'pt' has no depth parametrization to sweep" in pt
    assert "drop validate.depths, or use one of" in pt and "'tauformer'" in pt
    none = error_of(with_changes(TAU, **{"model.arch": {"head_dim": 16, "max_len": 64}}))
    assert "validate.depths=[2, 4, 8] compares model.arch.depth_parametrization completep with none" in none
    assert "set model.arch.depth_parametrization: completep" in none
    alone = error_of(with_changes(TAU, **{"validate.depths": None}))  # one width and nothing else to sweep
    assert "validate.widths=[32]: give 2–4 widths" in alone and "validate.depths" in alone


def test_the_depth_catalog_study_is_cpu_sized():
    spec = studies.load_catalog("depth_cpu")
    assert phases_of(spec) == ["tune", "validate"] and spec.validate_.depths == [2, 4, 8]
    assert spec.model.arch.depth == spec.model.arch.base_depth == 2 and spec.train.device == "cpu"
    assert len(validate_trials(spec, spec.space.defaults())) == 72 and spec.steps_for("validate") == 100
