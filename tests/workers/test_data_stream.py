"""Tests for the causal-LM objective, the streaming JSONL source and the diversion of batches to validation.

Small JSONL/text files in tmp_path, each test with its own PTCTL_DATA_DIR; no download.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from studies.spec import DataSpec
from workers import batches
from workers.data import (
    IGNORE_INDEX,
    MASK_ID,
    PAD_ID,
    UNK_ID,
    Batch,
    BatchStream,
    MemoryData,
    StreamData,
    is_held_out,
    prepare,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PTCTL_DATA_DIR", str(tmp_path / "home"))
    return tmp_path / "home"


def doc(i: int) -> str:
    """Document i: its index as digit words between markers (every token in any vocabulary), then filler."""
    return f"start {' '.join(str(i))} stop the quick brown fox"


def write_jsonl(folder: Path, n: int = 400, files: int = 2) -> str:
    """Documents 0..n-1 as JSONL records, split over `files` files (read in name order); returns a glob."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-n // files)
    for f in range(files):
        lines = [json.dumps({"text": doc(i)}) for i in range(f * per_file, min(n, (f + 1) * per_file))]
        (folder / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n\n")  # a trailing blank line is skipped
    return str(folder / "*.jsonl")


def stream_cfg(path: str, **changes) -> DataSpec:
    base = dict(source="jsonl", path=path, streaming=True, objective="clm", packing="lines", seq_len=16,
                eval_fraction=0.2, max_eval_sequences=10)
    return DataSpec(**{**base, **changes})


def rows_of(batch: Batch) -> torch.Tensor:
    """The packed clm rows (B, n + 1) a batch was cut from."""
    last = batch.labels[:, -1:].masked_fill(batch.labels[:, -1:] == IGNORE_INDEX, PAD_ID)
    return torch.cat([batch.input_ids, last], dim=1)


def doc_ids(data, rows) -> list[int]:
    """The index of the document of each row (lines packing: a row is one document)."""
    found = [re.fullmatch(r"start ([\d ]+) stop.*", data.tokenizer.decode(row)) for row in rows]
    return [int(m.group(1).replace(" ", "")) for m in found]


def draw(stream, n: int) -> list[Batch]:
    return [next(stream) for _ in range(n)]


def digest(batch_list) -> list[tuple]:
    return [(b.input_ids.tolist(), b.labels.tolist()) for b in batch_list]


# ---------------------------------------------------------------- clm, in memory


def test_clm_batches_are_the_rows_shifted_by_one(tmp_path):
    lines = ["one two three four five six seven eight nine ten eleven", "short line here", "a b c d"] * 20
    (tmp_path / "c.txt").write_text("\n".join(lines + ["solo"] * 5 + [f"rare{i} rare{i}" for i in range(8)]))
    cfg = DataSpec(source="text", path=str(tmp_path / "c.txt"), packing="lines", seq_len=6, objective="clm",
                     eval_fraction=0.1, vocab_size=22)  # the 19 frequent words: "rareI" is <unk>
    data = prepare(cfg)
    assert data._train.shape[1] == data._eval.shape[1] == 7  # seq_len + 1
    assert data.n_train + data.n_eval == 68  # one-token lines score nothing (dropped); <unk> is a target
    mlm = prepare(cfg.model_copy(update={"objective": "mlm"}))
    assert mlm._train.shape[1] == 6 and mlm.n_train + mlm.n_eval == 65  # mlm: <unk>-only lines dropped
    for batch in [*data.eval_batches(8), *draw(data.train_batches(8, seed=0), 5)]:
        ids, labels = batch.input_ids, batch.labels
        assert ids.shape == labels.shape == (len(ids), 6) and not (ids == MASK_ID).any()
        real_next = ids[:, 1:] != PAD_ID
        assert torch.equal(labels[:, :-1][real_next], ids[:, 1:][real_next])  # the label at t is token t + 1
        assert (labels[:, :-1][~real_next] == IGNORE_INDEX).all()  # <pad> is never a target
        assert torch.equal(batch.attention_mask, ids != PAD_ID)
        assert batch.n_masked == int((rows_of(batch)[:, 1:] != PAD_ID).sum())
    first = data.eval_batches(8)[0]
    rows = torch.from_numpy(data._eval[:8].astype(np.int64))
    assert torch.equal(first.input_ids, rows[:, :-1])
    assert torch.equal(first.labels, rows[:, 1:].masked_fill(rows[:, 1:] == PAD_ID, IGNORE_INDEX))
    assert digest(data.eval_batches(8)) == digest(data.eval_batches(8))


def test_clm_stream_packing_cuts_blocks_of_seq_len_plus_one(tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(f"paragraph {i} has a few words in it ." for i in range(300)))
    cfg = DataSpec(source="text", path=str(tmp_path / "c.txt"), seq_len=16, objective="clm")
    clm, mlm = prepare(cfg), prepare(cfg.model_copy(update={"objective": "mlm"}))
    assert clm._train.shape[1] == 17 and (clm._train != PAD_ID).all()
    k = min(clm._train.size, mlm._train.size)
    assert np.array_equal(clm._train.ravel()[:k], mlm._train.ravel()[:k])  # the same token stream, cut in 17s
    batch = next(clm.train_batches(4, seed=0))
    assert batch.n_masked == 4 * 16 and torch.equal(batch.labels[:, :-1], batch.input_ids[:, 1:])


# ---------------------------------------------------------------- streaming


def test_stream_split_eval_set_and_train_batches(tmp_path):
    n = 400
    data = prepare(stream_cfg(write_jsonl(tmp_path / "corpus", n)))
    assert isinstance(data, StreamData) and data.n_train is None and data.train_tokens is None
    held = [i for i in range(n) if is_held_out(0, i, 0.2)]  # global index across both files
    assert 50 < len(held) < 110
    assert doc_ids(data, data._eval) == held[:10]  # the first held-out documents, in stream order
    data.shuffle_rows = 32
    stream = data.train_batches(16, seed=0)
    seen = [i for b in draw(stream, 60) for i in doc_ids(data, rows_of(b))]  # 960 rows: 3 passes of ~320
    counts = np.bincount(seen, minlength=n)
    assert not counts[held].any()  # held-out documents never train
    train = np.setdiff1d(np.arange(n), held)
    assert counts[train].min() >= 2 and counts.sum() == 960  # every train document, again after a pass
    assert seen[:16] != sorted(seen[:16])  # shuffled


def test_stream_is_seeded_and_fixed_across_prepares(tmp_path):
    path = write_jsonl(tmp_path / "corpus", 300)
    first = prepare(stream_cfg(path, objective="mlm"))
    again = prepare(stream_cfg(path, objective="mlm"))
    assert digest(first.eval_batches(4)) == digest(again.eval_batches(4))
    assert (first.eval_batches(4)[0].input_ids == MASK_ID).any()  # mlm masks a stream too
    run = [digest(draw(d.train_batches(8, seed=s), 6)) for d, s in ((first, 1), (again, 1), (first, 2))]
    assert run[0] == run[1] and run[0] != run[2]
    other = prepare(stream_cfg(path, objective="mlm", seed=1))
    assert not np.array_equal(other._eval, first._eval)  # the seed picks the held-out documents


def test_stream_identical_in_a_fresh_process(tmp_path):
    path = write_jsonl(tmp_path / "corpus", 300)
    script = (
        "import hashlib; from studies.spec import DataSpec; from workers.data import prepare\n"
        f"d = prepare(DataSpec(source='jsonl', path={path!r}, streaming=True, seq_len=12))\n"
        "h = hashlib.sha256()\n"
        "for b in d.eval_batches(8) + [next(d.train_batches(8, seed=5))]:\n"
        "    h.update(b.input_ids.numpy().tobytes()); h.update(b.labels.numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "7", "PTCTL_DATA_DIR": str(tmp_path / "p")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    d = prepare(DataSpec(source="jsonl", path=path, streaming=True, seq_len=12))
    h = hashlib.sha256()
    for b in d.eval_batches(8) + [next(d.train_batches(8, seed=5))]:
        h.update(b.input_ids.numpy().tobytes())
        h.update(b.labels.numpy().tobytes())
    assert out.stdout.strip() == h.hexdigest()


def test_stream_reads_line_by_line_and_only_as_far_as_needed(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "corpus", 2000, files=1)
    lines_read = []

    class LineByLine:  # the file object `jsonl_texts` gets: iteration only, so no whole-file read
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def __iter__(self):
            for line in self.file:
                lines_read.append(line)
                yield line

    def jsonl(f) -> bool:
        return str(f).endswith(".jsonl")

    path_open, path_read, builtin_open = Path.open, Path.read_text, builtins.open
    monkeypatch.setattr(Path, "open", lambda f, *a, **k: LineByLine(path_open(f, *a, **k)) if jsonl(f)
                        else path_open(f, *a, **k))
    monkeypatch.setattr(Path, "read_text", lambda f, *a, **k: pytest.fail("read a whole file") if jsonl(f)
                        else path_read(f, *a, **k))
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: pytest.fail("opened outside Path.open") if jsonl(f)
                        else builtin_open(f, *a, **k))
    monkeypatch.setattr(batches, "_ENCODE_CHUNK", 8)
    data = prepare(stream_cfg(path, max_tokens=40, max_eval_sequences=4))
    assert 0 < len(lines_read) < 200  # tokenizer: 5 train documents; eval: 4 rows (in chunks of 8 texts)
    lines_read.clear()
    data.shuffle_rows = 8
    next(data.train_batches(4, seed=0))
    assert 0 < len(lines_read) < 20


def test_tokenizer_is_trained_on_max_tokens_train_words_only(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": f"word{i} common"}) + "\n" for i in range(200)))
    data = prepare(DataSpec(source="jsonl", path=str(tmp_path / "c.jsonl"), streaming=True, packing="lines",
                              seq_len=4, eval_fraction=0.2, max_tokens=20))
    train = [i for i in range(200) if not is_held_out(0, i, 0.2)]
    known = [i for i in range(200) if data.tokenizer.encode(f"word{i}") != [UNK_ID]]
    assert known == train[:10]  # 2 words a document: the first 10 train documents, no held-out one


def test_stream_without_train_rows_names_the_fix(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": f"w{i} x"}) + "\n" for i in range(20)))
    with pytest.raises(ValueError, match=r"data.path=.*no sequence of seq_len=64.*lower seq_len"):
        prepare(DataSpec(source="jsonl", path=str(tmp_path / "c.jsonl"), streaming=True))
    data = prepare(stream_cfg(str(tmp_path / "c.jsonl"), eval_fraction=0.5))
    empty = StreamData(data.cfg, data.tokenizer, data._eval, lambda: iter([]))
    with pytest.raises(ValueError, match="gave no train sequence"):
        next(empty.train_batches(2, seed=0))


# ---------------------------------------------------------------- diversion to validation


def test_batch_stream_diverts_every_kth_batch():
    stream = BatchStream(iter(range(1, 100)), val_every=3)
    assert [next(stream) for _ in range(6)] == [1, 2, 4, 5, 7, 8]
    assert stream.take_diverted() == [3, 6] and stream.take_diverted() == []
    assert next(stream) == 10 and stream.take_diverted() == [9]
    plain = BatchStream(iter(range(5)))
    assert list(plain) == [0, 1, 2, 3, 4] and plain.take_diverted() == []


@pytest.mark.parametrize("streaming", [False, True])
def test_train_batches_divert_to_validation(tmp_path, streaming):
    cfg = stream_cfg(write_jsonl(tmp_path / "corpus", 200), streaming=streaming, objective="mlm")
    data = prepare(cfg)
    if streaming:
        data.shuffle_rows = 16
    plain = digest(draw(data.train_batches(4, seed=3), 13))
    data.cfg = cfg.model_copy(update={"stream_val_every": 4})
    stream = data.train_batches(4, seed=3)
    assert digest(draw(stream, 9)) == [b for i, b in enumerate(plain[:11], 1) if i % 4]
    assert digest(stream.take_diverted()) == [plain[3], plain[7]] and stream.take_diverted() == []
    assert digest([next(stream)]) == [plain[12]] and digest(stream.take_diverted()) == [plain[11]]
    assert isinstance(data, StreamData if streaming else MemoryData)


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(streaming=True), "streaming"),
    (dict(source="text", path="c.txt", streaming=True), "streaming"),
    (dict(streaming=1, source="jsonl", path="c.jsonl"), "streaming"),
    (dict(objective="causal"), "objective"),
    (dict(stream_val_every=-1), "stream_val_every"),
    (dict(stream_val_every=1), "stream_val_every"),
    (dict(stream_val_every=2.0), "stream_val_every"),
])
def test_bad_stream_config_names_the_field(kwargs, field):
    with pytest.raises(ValidationError, match=rf"(^|\n|data\.){field}\b"):
        DataSpec.model_validate(kwargs, strict=True)  # the API's mode; lax reads 1 as True and 2.0 as 2


def test_a_list_text_field_is_joined_and_other_types_are_refused(tmp_path):
    """The TauGPT post's rows: {"text": [cve_id, title, description]}."""
    from workers.data import load_documents

    path = tmp_path / "cve.jsonl"
    path.write_text(json.dumps({"text": ["CVE-1", "overflow", "in the parser"]}) + "\n")
    assert load_documents(DataSpec(source="jsonl", path=str(path))) == ["CVE-1 overflow in the parser"]
    path.write_text(json.dumps({"text": {"id": 1}}) + "\n")
    with pytest.raises(ValueError, match="holds a dict, not text or a list of strings"):
        load_documents(DataSpec(source="jsonl", path=str(path)))
