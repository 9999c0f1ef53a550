"""The model configs of `studies.arch`: each family's arch plus the trial's sizes and hparams, validated once."""

import pytest
from pydantic import ValidationError

from studies.arch import rebase, width_error, width_step
from studies.families.pt import PTArch, PTConfig
from studies.families.tauformer import TauArch, TauConfig
from studies.family import FAMILIES
from studies.model import space_class

SIZE = {"vocab_size", "width", "base_width", "parametrization"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_model_config_is_its_arch_the_size_and_the_hparams_but_lr(family):
    entry = FAMILIES[family]
    hparams = set(space_class(family).HPARAMS) - {"lr"}
    assert set(entry.config.model_fields) == set(entry.arch.model_fields) | SIZE | hparams
    assert issubclass(entry.config, entry.arch)


@pytest.mark.parametrize(("arch", "config"), [
    (PTArch(n_channels=4, topic="single_split", n_topics=6), PTConfig),
    (PTArch(paradigm="rank", rank=12), PTConfig),
    (TauArch(head_dim=8, kv_group=2), TauConfig),
])
def test_the_config_builds_exactly_at_the_widths_the_arch_allows(arch, config):
    base = 16
    for width in range(1, 97):
        ok = width_error(arch, base, width, "width") is None
        assert ok == (width % width_step(arch, base) == 0)
        kwargs = {**arch.model_dump(), "vocab_size": 10, "width": width, "base_width": base}
        if ok and width_error(arch, base, base, "base_width") is None:
            config(**kwargs)
        elif not ok:
            with pytest.raises(ValidationError, match=f"width={width} "):
                config(**kwargs)


def test_pt_sizes_scale_with_width_from_the_base():
    cfg = PTConfig(vocab_size=10, width=64, base_width=16, n_channels=2, rank=8, topic="single_split", n_topics=4)
    assert (cfg.h, cfg.r, cfg.m, cfg.n_buckets, cfg.width_mult) == (8, 8, 16, 8, 4.0)
    by_rank = cfg.model_copy(update={"paradigm": "rank"})
    assert (by_rank.h, by_rank.r) == (2, 32)
    assert rebase(PTArch(n_channels=2, topic="single_split", n_topics=4), 16, 64).model_dump() == \
        PTArch(n_channels=8, topic="single_split", n_topics=16).model_dump()


def test_base_width_defaults_to_width_and_mup_needs_uv():
    assert PTConfig(vocab_size=10, width=24, n_channels=3).base_width == 24
    with pytest.raises(ValidationError, match="μP is specified for 'uv' only"):
        PTConfig(vocab_size=10, width=16, decomposition="uvw", parametrization="mup")
    with pytest.raises(ValidationError, match="vocab_size"):
        FAMILIES["bert"].config(vocab_size=0, width=16)
