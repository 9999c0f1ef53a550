"""Batches from packed token rows: masking (mlm), shifting (clm), in-memory and streaming training data.

The layer under `workers.data`, which re-exports all of it: it knows token ids and rows, not files or
tokenizer training. A packed row holds `seq_len` tokens (mlm) or `seq_len + 1` (clm: the inputs and, shifted
by one, their next-token labels). `MemoryData` holds its train rows in memory; `StreamData` packs them live from
a stream of texts. Both hand out a `BatchStream`, which can divert every k-th batch to validation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import torch

from workers.tokenizer import MASK_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, Tokenizer

if TYPE_CHECKING:
    from studies.spec import DataSpec

IGNORE_INDEX = -100  # label of unscored positions (torch's cross_entropy default)
SHUFFLE_ROWS = 4096  # rows in a stream's shuffle buffer (StreamData.shuffle_rows)
_ENCODE_CHUNK = 256  # texts per `encode_batch` call when packing a stream


@dataclass(frozen=True)
class Batch:
    """One batch: masked (mlm) or shifted (clm)."""

    input_ids: torch.Tensor  # (B, n) long: the tokens after masking (mlm), the row but its last token (clm)
    labels: torch.Tensor  # (B, n) long: the original token where selected (mlm), the next token (clm); -100 elsewhere
    attention_mask: torch.Tensor  # (B, n) bool: True at real tokens, False at <pad>

    @property
    def n_masked(self) -> int:
        """The number of scored positions (labels other than IGNORE_INDEX): masked tokens, or next tokens."""
        return int((self.labels != IGNORE_INDEX).sum())

    def to(self, device: torch.device | str) -> Batch:
        """The batch on `device`; from host memory to CUDA, through pinned memory and an asynchronous copy."""
        device = torch.device(device)
        return Batch(*(_moved(t, device) for t in (self.input_ids, self.labels, self.attention_mask)))


def _moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


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


def shift_tokens(rows: torch.Tensor) -> Batch:
    """A causal-LM batch from rows (B, n + 1): inputs `rows[:, :-1]`, labels `rows[:, 1:]` (the label at t is
    the token at t + 1), IGNORE_INDEX where that is `<pad>`. Nothing is masked."""
    inputs, targets = rows[:, :-1].contiguous(), rows[:, 1:]  # (B, n), (B, n)
    return Batch(inputs, targets.masked_fill(targets == PAD_ID, IGNORE_INDEX), inputs != PAD_ID)


# ---------------------------------------------------------------- packing


def row_width(cfg: DataSpec) -> int:
    """Tokens per packed row: seq_len (mlm), seq_len + 1 (clm: inputs and labels share the row)."""
    return cfg.seq_len + (cfg.objective == "clm")


def pack_rows(chunks: Iterable[list[list[int]]], cfg: DataSpec) -> Iterator[np.ndarray]:
    """(m, row_width) int32 rows per chunk of encoded texts, per `cfg.packing`, without rows that score nothing.

    "stream" concatenates the texts and cuts the result in row_width blocks, carrying a chunk's tail into the
    next one (the last tail is dropped); "lines" makes a row of each text, cut or padded with <pad>. A row
    scores nothing if it has no maskable token (mlm: only pad/unk) or no next token (clm: one real token).
    """
    width = row_width(cfg)
    carry = np.zeros(0, dtype=np.int32)
    for encoded in chunks:
        if cfg.packing == "stream":
            flat = np.concatenate([carry, np.fromiter((i for ids in encoded for i in ids), dtype=np.int32)])
            cut = len(flat) // width * width
            rows, carry = flat[:cut].reshape(-1, width), flat[cut:]
        else:
            rows = np.full((len(encoded), width), PAD_ID, dtype=np.int32)
            for row, ids in zip(rows, encoded, strict=True):
                row[: min(len(ids), width)] = ids[:width]
        if cfg.objective == "clm":
            yield rows[(rows[:, 1:] != PAD_ID).any(axis=1)]
        else:
            yield rows[((rows != PAD_ID) & (rows != UNK_ID)).any(axis=1)]


def pack(encoded: list[list[int]], cfg: DataSpec) -> np.ndarray:
    """`pack_rows` of one chunk: all the rows of `encoded`."""
    return next(pack_rows([encoded], cfg))


def encode_rows(texts: Iterable[str], tokenizer: Tokenizer, cfg: DataSpec) -> Iterator[np.ndarray]:
    """`pack_rows` of `texts`, read and encoded lazily, `_ENCODE_CHUNK` texts at a time."""
    texts = iter(texts)
    chunks = iter(lambda: list(islice(texts, _ENCODE_CHUNK)), [])
    return pack_rows((tokenizer.encode_batch(chunk) for chunk in chunks), cfg)


def take_rows(chunks: Iterable[np.ndarray], n: int, width: int) -> np.ndarray:
    """The first `n` rows of a stream of row chunks (fewer if it ends first); reads no chunk past them."""
    taken, count = [np.zeros((0, width), dtype=np.int32)], 0
    for rows in chunks:
        taken.append(rows[: n - count])
        count += len(taken[-1])
        if count >= n:
            break
    return np.concatenate(taken)


# ---------------------------------------------------------------- training data


class BatchStream(Iterator[Batch]):
    """Training batches drawn from the endless iterator `batches`.

    With `val_every` = k > 0 every k-th batch drawn (the k-th, 2k-th, ...) is diverted: `next` skips it and
    `take_diverted` hands it out, as validation data in the style of streaming LM runs. Diverted batches
    pile up until taken. k = 0 diverts nothing.
    """

    def __init__(self, batches: Iterator[Batch], val_every: int = 0) -> None:
        self._batches, self._every, self._drawn = batches, val_every, 0
        self._diverted: list[Batch] = []

    def __next__(self) -> Batch:
        while True:
            batch = next(self._batches)
            self._drawn += 1
            if not self._every or self._drawn % self._every:
                return batch
            self._diverted.append(batch)

    def take_diverted(self) -> list[Batch]:
        """The batches diverted since the last call, oldest first; clears them."""
        taken, self._diverted = self._diverted, []
        return taken


class PackedData:
    """A tokenizer and fixed eval rows; turns rows into batches, masked (mlm) or shifted (clm)."""

    n_train: int | None  # train rows; None for a stream
    train_tokens: int | None  # non-<pad> tokens in the train rows; None for a stream

    def __init__(self, cfg: DataSpec, tokenizer: Tokenizer, eval_: np.ndarray) -> None:
        self.cfg, self.tokenizer, self.vocab_size = cfg, tokenizer, tokenizer.vocab_size
        self.n_eval, self._eval = len(eval_), eval_

    def _batch(self, rows: np.ndarray, generator: torch.Generator) -> Batch:
        ids = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        if self.cfg.objective == "clm":
            return shift_tokens(ids)
        return mask_tokens(ids, self.cfg.mask_rate, self.cfg.mask_mode, self.vocab_size, generator)

    def eval_batches(self, batch_size: int) -> list[Batch]:
        """All eval rows in order, masked (mlm) by a generator seeded with `cfg.seed`.

        The same list on every call and in every process for a given `batch_size`; compare eval losses
        across trials at one `batch_size`.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        generator = torch.Generator().manual_seed(self.cfg.seed)
        starts = range(0, self.n_eval, batch_size)
        return [self._batch(self._eval[start:start + batch_size], generator) for start in starts]


class MemoryData(PackedData):
    """Packed train/eval rows held in memory ((N, row_width) int32, <pad> = 0), mlm or clm."""

    n_train: int
    train_tokens: int

    def __init__(self, cfg: DataSpec, tokenizer: Tokenizer, train: np.ndarray, eval_: np.ndarray,
                 train_tokens: int) -> None:
        super().__init__(cfg, tokenizer, eval_)
        self.train_tokens = train_tokens
        self.n_train, self._train = len(train), train

    def train_batches(self, batch_size: int, seed: int) -> BatchStream:
        """Endless shuffled train batches (full ones only; a new order every epoch), with fresh masks (mlm).

        Order and masks come from one `torch.Generator` seeded by `seed`: the same seed, the same stream.
        Diverted batches (`cfg.stream_val_every`) hold train rows, which come back in later epochs.
        """
        if not 1 <= batch_size <= self.n_train:
            raise ValueError(f"batch_size={batch_size}: must be in [1, n_train={self.n_train}]")
        generator = torch.Generator().manual_seed(seed)

        def batches() -> Iterator[Batch]:
            while True:
                order = torch.randperm(self.n_train, generator=generator).numpy()
                for start in range(0, self.n_train - batch_size + 1, batch_size):
                    yield self._batch(self._train[order[start:start + batch_size]], generator)

        return BatchStream(batches(), self.cfg.stream_val_every)


class StreamData(PackedData):
    """Train rows packed live from `train_texts()` (a fresh pass per call), pass after pass.

    Only a shuffle buffer of `shuffle_rows` rows is held in memory. `n_train` and `train_tokens` are None:
    a stream's size is unknown.
    """

    n_train = train_tokens = None
    shuffle_rows = SHUFFLE_ROWS

    def __init__(self, cfg: DataSpec, tokenizer: Tokenizer, eval_: np.ndarray,
                 train_texts: Callable[[], Iterable[str]]) -> None:
        super().__init__(cfg, tokenizer, eval_)
        self._train_texts = train_texts

    def rows(self) -> Iterator[np.ndarray]:
        """Chunks of packed train rows in stream order, epoch after epoch."""
        while True:
            n_rows = 0
            for rows in encode_rows(self._train_texts(), self.tokenizer, self.cfg):
                n_rows += len(rows)
                yield rows
            if not n_rows:
                raise ValueError(f"data.path={self.cfg.path!r}: a whole pass over the stream gave no train "
                                 f"sequence of seq_len={self.cfg.seq_len}; add documents, or lower seq_len or "
                                 "eval_fraction")

    def train_batches(self, batch_size: int, seed: int) -> BatchStream:
        """Endless train batches: rows fill a buffer of max(shuffle_rows, batch_size) rows, and once it is full
        each batch is a random draw from it, which new rows then replace.

        Draws and masks come from one `torch.Generator` seeded by `seed`: the same seed, the same stream.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        generator = torch.Generator().manual_seed(seed)
        capacity = max(self.shuffle_rows, batch_size)

        def batches() -> Iterator[Batch]:
            pool = np.zeros((0, row_width(self.cfg)), dtype=np.int32)
            for rows in self.rows():
                pool = np.concatenate([pool, rows])
                while len(pool) >= capacity:
                    pick = torch.randperm(len(pool), generator=generator)[:batch_size].numpy()
                    yield self._batch(pool[pick], generator)
                    pool = np.delete(pool, pick, axis=0)

        return BatchStream(batches(), self.cfg.stream_val_every)
