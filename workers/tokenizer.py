"""Tokenizers with the ids every ptctl model expects: `<pad>` = 0, `<unk>` = 1, `<mask>` = 2."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<pad>", "<unk>", "<mask>")
PAD_ID, UNK_ID, MASK_ID = 0, 1, 2
TOKENIZERS = ("word", "wordpiece", "bpe")


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
        options: dict[str, Any] = dict(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
        trainer: trainers.Trainer
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
