"""A validate sweep: lr (and, along width, other hparams) swept along one axis — width, training steps, depth, batch
size, context — under the pair of parametrizations that axis judges. One file per axis (`studies.sweeps`), each a
`Sweep` and the spec fields it adds to `validate` (`Fields`).

A sweep plans its trials (`PlannedTrial.sweep` its name, `PlannedTrial.at` its axis's values), applies them to a
trial's config, picks its rows of the trial table (column `sweep`), judges them into drifts per doubling of its axis
(`analysis.LRDrift`, `axis` its name) and regrets (`analysis.Regret`, `axis` its name along any axis but width), and
tells them: its verdict metrics, tags and MLflow columns, its sentence and summary lines, its report paragraphs, its
figure, and the flag it raises on tune's setup. The validate phase (`studies.phases.validate`) loops over the
registry; nothing outside a sweep's file names its axis.

This module and the sweeps import no pandas at load time (the spec imports them): `analysis` loads on first use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import analysis

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift, Regret
    from analysis.constants import Axis
    from studies.phases.base import Artifacts, Verdict
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec


def increasing(values: list[int] | None, error: str) -> list[int] | None:
    """A sweep's values: None, or 2–4 strictly increasing ones (else a `ValueError` saying `error`)."""
    if values is not None and (not 2 <= len(values) <= 4 or any(b <= a for a, b in zip(values, values[1:],
                                                                                        strict=False))):
        raise ValueError(error)
    return values


@dataclass
class Judged:
    """What a sweep's judgement adds to the validate result."""

    drifts: list[LRDrift] = field(default_factory=list)  # along its axis
    regrets: list[Regret] = field(default_factory=list)


class Sweep(ABC):
    """One axis of the validate phase (module docstring). Subclasses set the class variables and override what
    their axis does differently; the defaults suit an lr sweep along the axis at every validate width."""

    name: ClassVar[str]  # the registry key, the trial table's `sweep`, its drifts' and regrets' `axis`
    key: ClassVar[str]  # the `validate` field that asks for it
    forecast: ClassVar[bool] = True  # its lr sweeps enter the forecast (`analysis.forecast`)
    alone: ClassVar[bool] = True  # it can run at one validate width, without the width sweep (else: 2–4 widths)
    axis: ClassVar[Axis]  # its column, words and judged pair (`analysis.constants.Axis`)
    header: ClassVar[str]  # the summary table's column of its value
    legend: ClassVar[str]  # a figure curve's label, "{}" its value
    figure: ClassVar[str | None] = None  # its figure's file name (None: none)
    caption: ClassVar[str] = ""  # the report's figure heading: "validate (<caption>)"
    flag_label: ClassVar[str] = ""  # the word before its flag on tune's setup
    drift_key: ClassVar[str] = ""  # its drift metrics' and pass tag's prefix: "lr_<drift_key>_drift"

    # ----------------------------------------------------------------------------- the plan
    @abstractmethod
    def present(self, v: ValidateSpec) -> bool:
        """Whether the study sweeps this axis."""

    @abstractmethod
    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        """Its planned trials, the other hparams at `centre`."""

    def apply(self, spec: StudySpec, at: Mapping[str, Any], config: dict[str, Any]) -> None:  # noqa: B027
        """Set a trial's config (`StudySpec.trial_config`'s dict) at its values `at` along this axis; by default
        nothing: a width sweep's trial is the phase's own at its width."""

    def problems(self, spec: StudySpec) -> list[str]:
        """The spec's cross-field problems with this sweep (each naming the field and the fix)."""
        return []

    # ----------------------------------------------------------------------------- the judgement
    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """Its rows of the validate trial table (column `sweep`)."""
        return table[table["sweep"] == self.name]

    def judge(self, spec: StudySpec, rows: pd.DataFrame, centre: Mapping[str, float], out: Artifacts) -> Judged:
        """Its figure, lr's drift along the axis at each width with rows, and the regret of carrying the base value's
        lr (none without a `base`)."""
        v = spec.validate_
        assert v is not None
        if self.figure:
            analysis.plot_sweep(rows, out.figure(self.figure), self.axis, self.legend, note=self.figure_note())
        drifts = [analysis.lr_drift(rows[rows["width"] == w], threshold=v.drift_threshold, axis=self.axis)
                  for w in v.widths if (rows["width"] == w).any()]
        base = self.base(spec)
        return Judged(drifts=drifts, regrets=[] if base is None else analysis.carried_regrets(rows, base, self.axis))

    def base(self, spec: StudySpec) -> int | None:
        """The value whose optimum is carried along the axis (the tune phase's); None: no regret is judged."""
        return None

    def figure_note(self) -> str:
        return ""

    # ----------------------------------------------------------------------------- what it says
    def metrics(self, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> dict[str, float]:
        """`lr_<drift_key>_drift.<param>.w<width>`, and each regret as `<name>_regret[_pct].lr.<param>.w<width>.<x>`."""
        drift = {f"lr_{self.drift_key}_drift.{p}.w{d.width}": x for d in drifts if d.optima for p, x in d.drift.items()}
        return {**drift, **{f"{name}.{r.hparam}.{r.parametrization}.w{r.width}.{self.regret_key}{r.at}": x
                            for r in regrets for name, x in ((f"{self.drift_key}_regret", r.regret),
                                                             (f"{self.drift_key}_regret_pct", r.regret_pct))
                            if x is not None}}

    regret_key: ClassVar[str] = ""  # a regret metric's value prefix: "b" (b16)

    def tags(self, drifts: Sequence[LRDrift]) -> dict[str, str]:
        return {f"lr_{self.drift_key}_drift_passed": str(all(d.passed for d in drifts)).lower()} if drifts else {}

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        """The MLflow runs-table columns it shows of the phase's `verdict` (by place, `studies.phases.base`);
        default none: they stay on the run page."""
        return []

    def figures(self, drifts: Sequence[LRDrift]) -> dict[str, str]:
        """The report's figures of its result: heading → file name."""
        return {f"validate ({self.caption})": self.figure} if self.figure and drifts else {}

    def sentence(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
        """Its parts of the verdict sentence: each drift, its lines, its flag."""
        flag = self.flag(spec, drifts)
        return [*(f"lr {self.verdict_words} drift: {d.verdict}." for d in drifts), *self.lines(spec, drifts, regrets),
                *([f"{self.flag_label.capitalize()}: {flag}."] if flag else [])]

    verdict_words: ClassVar[str] = ""  # "lr <verdict_words> drift: ..." in the sentence

    def lines(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
        """Its bold lines in the summary, the report and the sentence (the regrets in words)."""
        return [line for d in drifts if d.width is not None
                and (line := analysis.carried_line([r for r in regrets if r.width == d.width], d.width,
                                                   title=self.regret_title, label=self.regret_label,
                                                   words=self.axis.words))]

    regret_title: ClassVar[str] = ""  # "Batch regret in lr at width 64: ..."
    regret_label: ClassVar[str] = ""  # "...: batch 8: mup +0.004 nats ..."

    def section(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], list[str]]:
        """Its report paragraphs: (before every sweep's drift sections, after them: its lines in bold)."""
        return [], [f"**{line}**" for line in self.lines(spec, drifts, regrets)]

    def summary(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], Any]:
        """Its summary lines after the drift tables (printed bold), and a rich table or None after them."""
        return self.lines(spec, drifts, regrets), None

    def flag(self, spec: StudySpec, drifts: Sequence[LRDrift] = ()) -> str | None:
        """A warning on tune's setup along this axis (None: no reason to worry); `drifts`: what this sweep
        measured."""
        return None
