"""A spec's content hash and what it dumps are pinned: every catalog spec, and variants that set each field added
after the hash was fixed (`studies.arch.LATER`) or leave a newer one at its default. A study started before keeps
its id and resumes (`state.json` stores the hash; `workers.driver.study_id` is name + hash); its YAML, its trials'
Tune configs (their keys in the ledger of finished trials) and trial configs (their MLflow params) stay as they were.

A change here is a change of every study's identity: new pins mean no study started before resumes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from studies import load_catalog
from studies.cost import planned_trials
from studies.plan import ledger_form
from studies.spec import CATALOG_DIR, StudySpec


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    return {**base, **{k: _merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                       for k, v in changes.items()}}


def _spec(name: str, **changes: Any) -> StudySpec:
    return StudySpec.model_validate(_merged(load_catalog(name).as_dict(), changes))


VARIANTS = {  # a catalog spec with one newer field set (or an older one changed beside newer ones at default)
    "tiny+tune.batch_size": lambda: _spec("tiny", tune={"batch_size": 8}),
    "tiny+adam_eps": lambda: _spec("tiny", train={"adam_eps": 1e-6}),
    "tiny+adam_eps_scaling": lambda: _spec("tiny", train={"adam_eps_scaling": "width"}),
    "tiny+decay_groups": lambda: _spec("tiny", train={"weight_decay_groups": {"hidden": 0.1}}),
    "tiny+decay_form": lambda: _spec("tiny", train={"weight_decay_form": "independent"}),
    "tiny+weight_decay": lambda: _spec("tiny", train={"weight_decay": 0.1}),
    "tiny+space_decay": lambda: _spec("tiny", space={"weight_decay": {"low": 0.01, "high": 1.0, "log": True}}),
    "wd_cpu+constant": lambda: _spec("weight_decay_cpu", transfer={"weight_decay": "constant"}),
    "batch_cpu+steps": lambda: _spec("batch_cpu", validate={"batch_fixed": "steps"}),
    "depth_cpu-base_depth": lambda: _spec("depth_cpu", model={"arch": {"base_depth": None}}),
    "depth_cpu-completep": lambda: _spec("depth_cpu", model={"arch": {"depth_parametrization": "none",
                                                                           "base_depth": None}},
                                        validate={"depths": None, "widths": [32, 64]}),
}
SPECS = {**{p.stem: (lambda n=p.stem: load_catalog(n)) for p in sorted(CATALOG_DIR.glob("*.yaml"))}, **VARIANTS}


def _dumps(spec: StudySpec) -> str:
    """The YAML, and each planned trial's Tune config as the ledger knows it (`ledger_form`) and trial config, by
    trial key (the order trials are planned in is no identity)."""
    """What a study shows and keys its trials by: its YAML, and each planned trial's Tune config and trial config."""
    trials = {phase: sorted(([ledger_form(t.as_dict()), t.trial_config(spec)] for t in planned),
                            key=lambda p: p[0]["trial_key"])
              for phase, planned in planned_trials(spec).items()}
    return spec.to_yaml() + json.dumps(trials, sort_keys=True, default=str)


def _pins() -> dict[str, tuple[str, str]]:
    """Each spec's content hash and a digest of its dumps (`_dumps`): how the pins below were made."""
    return {name: (make().content_hash(), hashlib.sha256(_dumps(make()).encode()).hexdigest()[:16])
            for name, make in SPECS.items()}


PINS = {  # made by `_pins()` on the code before the hash had one rule and before the sweeps' `sweep` and `at`
    # (muon_cpu, muon_tau_cpu and seq_len_cpu, new in the catalog since: by the code that added them; muon_cpu's
    # again when it took the optimizer comparison and a wider lr grid)
    "muon_cpu": ("5e7864ae2a2eb6b79ae53121a2fd57d0c0e1010e6850dd2c06660c31f60e8f13", "72c071d4786013bd"),
    "muon_tau_cpu": ("bd1814e966e0d24505d11250f45fb05ae9c0f3dd99cb736906f287819f2fb763", "1fa726794f4d1139"),
    "seq_len_cpu": ("c5ab58515e58742624acbefeec211ef2d809f3a81666eb77dd822a189ebadb9b", "3ae623b5225a52d7"),
    "batch_cpu": ("69e970b6ecf56dcc5841c3d023e3eaeda5766d4040dcf4074a0d17b9026be415", "df6b2f8e36c768aa"),
    "compare_cpu": ("b990cf626d01870cfea44f102c3e2f6e986b052a421fc251b4aada5a279e45ed", "5484367a5c69ad4a"),
    "compare_cpu_bpe": ("47927ee3fb73421a7597a5953fbc07549a4b9e6ec4a46b267286ab4628d34494", "42ea0c4032f923a4"),
    "compare_paper": ("fcd63c70a705d940779372a80f64e52aa4a80b6973fb66ea97e2108f3253f4af", "8b96cc97a939f841"),
    "cpu_certify": ("d2e6067c882effd986f2842f9f855f0253c5a3524ded0012090c874a75515e58", "4ebd5ce266f2e30f"),
    "cpu_demo": ("e48352ede783facdc1e324124261902dcb3913ed98c6299a2d397066e60fb958", "d118be2eb0f134b6"),
    "depth_cpu": ("33c67939603c3e3f8081093b1583163414e72b81697ff7fa3c391eec230f32d5", "4945ed0ed1ae7504"),
    "forecast_cpu": ("688f2d441c0c60c6bd5032b46aba4878a9e51ba9f87926eff579b019f2e74019", "025fa30098b9e729"),
    "hf_llama_cpu": ("0fed830098dc957fc24d70209e47ea9a02f5fa143a3c09d375d9f188b79cae79", "6106a906cfbb2698"),
    "horizon_cpu": ("3a5d954715d090de51e9c4442a96fb492faebc187add761ae7bc577b0488d5a0", "5a9cb569a7cf3015"),
    "nanogpt_axes": ("7fe1a2e985ee3005efc7cdac4a60c89efea56f2cd241552f7fa301a0c1675d35", "1df013078ab83b18"),
    "nanogpt_mup": ("e05a64af9fb2065aa6c373bda00fdd5911777346ba72c0cbd7cefb59969b5fef", "e16bc20f4fec96e3"),
    "paper_gpu": ("1b901742ae344a4871d5438c98d3bcb835bc5cb452daae387bb9576f4a290b2b", "38e6a71c9f17574c"),
    "paper_pt_minipile": ("967496074cac9db24b186a258ddf7dbca52d19e9cc269462326f007cbc1b3960", "3c7626fb6c563b2e"),
    "pt_lr_alignment": ("b64143c9a7f162e031bc8204835db4c389acb82908a3fc658c0254447b3419b4", "f94d8abb60c2a577"),
    "tau_cpu": ("cd45b71694b8d6f5ad1ef2577230f95bb8d3e10c406801664970768034c2dd49", "79f4aad45723a3d0"),
    "tau_cpu_dot": ("11dbfea46e06bcc046f28e10ccb7741b837c453106ef2b4a0b03dcf04d06a844", "6ecf739a84694087"),
    "taugpt_30m": ("8bc111ab876d7eaa0d505b825f11a29ce932b4f3c34f5c2267902485bf5565f9", "ff7f748ffc980c0f"),
    "tiny": ("1a77d356e3a366eaa8fe40ebce02bbe681ede3afcff41fa4646bc374a640696d", "2a14a710a6015b51"),
    "tiny_tau": ("c4568282dc89a0502c044cd252648952fbaf0e4a67e524e2867541aaf2c9317f", "c82d9715620a428e"),
    "weight_decay_cpu": ("63776589e4b0c93f338ccd8c19f4d3a3c1604317c931bf625c73cf6cee31482d", "722b668d516b28f9"),
    "tiny+tune.batch_size": ("893ccf577eb74454121e9545b0f00c0c97936de86f8dceeece797e88f6bf8f48", "b6964e132bb377e5"),
    "tiny+adam_eps": ("99fee7fba843fa1700f5c79f97ec5c95810430f524c001d19fa7114de7a78127", "0d0b7100fcb02cf9"),
    "tiny+adam_eps_scaling": ("ce0d171bc9d5b988896c0010181deff4422b06c9e10e540603b5fc1753486e09", "87ec05f5abaa78e1"),
    "tiny+decay_groups": ("6ef6e916c2587e1de0f789484abdeb1d615e1e524f85e2467600589dbacb13e9", "e4592e845c1f77fd"),
    "tiny+decay_form": ("bf981e8e247f637d583717b074f3fe1d2ba95a8c2621acb1234f9400ef3da105", "5b81c4cc93669322"),
    "tiny+weight_decay": ("1a1570931e18c774bed3ae4e86431533e8b47df5bead91e621bcbd0f9d85f7f1", "0914776f7c8fdc02"),
    "tiny+space_decay": ("9ffdf97b0f632fb08460c17f839b1b2dafbf33ca61d5e8fbe54ae50a3807d54f", "704dc049b6171219"),
    "wd_cpu+constant": ("9fc1eef75fa89d7c54c9fc9008bc05feb12dd3cd5547a31ac90fdb22c7207b68", "e7cf1b0b691c4aff"),
    "batch_cpu+steps": ("c448000cdc6923f17049b656705b9dc2ab546a3dbc3e9ffe10d1ef5b6b58a250", "3967c27ed90a0810"),
    "depth_cpu-base_depth": ("4f5467e29a08859cf379ec248b93222d1f9cfdf1a477c0a05526042d554908d1", "88889562cb50f23c"),
    "depth_cpu-completep": ("a32bd6b33441570b77543a9b2b8aca00dd9c4c5737ab54354c17f6330c081315", "5adc17350e8a4105"),
}


def test_every_spec_and_variant_is_pinned():
    assert sorted(PINS) == sorted(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_specs_content_hash_and_dumps_are_unchanged(name):
    spec = SPECS[name]()
    assert (spec.content_hash(), hashlib.sha256(_dumps(spec).encode()).hexdigest()[:16]) == PINS[name]


def _subclasses(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _subclasses(sub))]


def test_every_later_field_is_a_field_of_its_section_and_dumped_once_set():
    """`later` names real fields (a typo would drop nothing and leave a hash to change), and a group leaves the dump
    only while every field of it is at its default."""
    from studies.arch import LaterFields

    sections = [StudySpec, *_subclasses(LaterFields)]
    assert {c.__name__ for c in sections} >= {"TrainSpec", "TrialConfig", "TuneSpec", "TransferSpec", "ValidateSpec",
                                              "Space", "DepthArch", "UTArch", "TauArch"}
    for section in sections:
        assert all(name in section.model_fields for group in section.later for name in group), section
    tiny = load_catalog("tiny")
    assert "batch_size" not in tiny.as_dict()["tune"] and "compare" not in tiny.as_dict()
    assert _spec("tiny", tune={"batch_size": 8}).as_dict()["tune"]["batch_size"] == 8
    arch = load_catalog("depth_cpu").model.arch  # completep at base_depth 2
    assert arch.model_dump()["base_depth"] == 2
    assert arch.model_copy(update={"base_depth": None}).model_dump()["base_depth"] is None  # one of the group set
    plain = arch.model_copy(update={"depth_parametrization": "none", "base_depth": None}).model_dump()
    assert not {"depth_parametrization", "base_depth"} & set(plain)
