"""The built-in families, one module each (`studies/families/`): the defaults a trial gets agree between a
family's space and its config, and the old import paths still name the same classes."""

from __future__ import annotations

import pytest

from studies.family import FAMILIES, PLUGINS, family_names

BUILT_INS = sorted(set(FAMILIES) - set(PLUGINS))  # an installed plugin's family lives in its own package


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_space_default_is_the_config_default(family):
    """A trial gets the space's default for an hparam it does not search; building the config without that
    hparam (a test, the coordinate check) gets the config's: they are one value."""
    entry = FAMILIES[family]
    space, config = entry.space(), entry.config.model_fields
    for name, value in space.defaults().items():
        if name == "lr":  # the optimizer's, not the model config's (`TrialConfig.lr`)
            continue
        assert config[name].default == value, f"{family}: space {name} default {value}, config {config[name].default}"


@pytest.mark.parametrize("family", BUILT_INS)
def test_a_family_lives_in_its_module(family):
    entry = FAMILIES[family]
    modules = {c.__module__ for c in (entry.arch, entry.config)}
    assert modules == {f"studies.families.{family}"}
    assert entry.space.__module__.startswith("studies.families.")


def test_the_built_ins_register_in_their_order():
    assert family_names()[:4] == ["pt", "bert", "ut", "tauformer"]
