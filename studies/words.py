"""The nearest valid name to a mistyped one, for errors that name the fix ("did you mean batch_size?")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word` (difflib's ratio >= 0.6, case ignored), or None when none is close."""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"did you mean X?" for the nearest of `choices`; "" when none is close."""
    best = nearest(word, choices)
    return f"did you mean {best}?" if best else ""
