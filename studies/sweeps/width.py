"""The width sweep, μTransfer's evidence: lr (and each of `validate.hparams`, and AdamW's λ with
`validate.weight_decays`) swept at 2–4 widths under each parametrization, the other hparams at the centre, trained
`StudySpec.validate_horizon()` steps. `analysis.lr_drift` measures how far each optimum moves per doubling of width
(passed against `validate.drift_threshold`), `analysis.transfer_regret` what the transferred values cost at each swept
width that was transferred to (`regret_widths`); the λ sweep's optimum is also read as AdamW's timescale
τ* = 1/(ηλ*) and τ*/T per width (`analysis.weight_decay.optimum_timescales`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

import analysis
from analysis.constants import WIDTH
from studies.space import WEIGHT_DECAY
from studies.sweeps.base import Judged, Sweep

if TYPE_CHECKING:
    import pandas as pd

    from analysis import LRDrift, Regret
    from studies.phases.base import Artifacts, Verdict
    from studies.plan import PlannedTrial
    from studies.spec import StudySpec
    from studies.sweeps import ValidateSpec


class Fields(BaseModel):
    """The width sweep's fields are `validate`'s own (`studies.sweeps.ValidateSpec`: widths, lrs, hparams,
    weight_decays)."""

    sweep: ClassVar[Sweep]  # set below: this sweep


def figure_of(hparam: str) -> str:
    return "mutransfer" if hparam == "lr" else f"mutransfer_{hparam}"


def regret_widths(spec: StudySpec) -> list[int]:
    """The swept widths the study transferred to: those in both `transfer.widths` and `validate.widths`, and the
    tune base width when it is swept."""
    v = spec.validate_
    assert v is not None
    transferred = {spec.tune.base_width, *(spec.transfer.widths if spec.transfer is not None else [])}
    return [w for w in v.widths if w in transferred]


class Width(Sweep):
    name: ClassVar[str] = "width"
    key: ClassVar[str] = "widths"
    axis = WIDTH
    header: ClassVar[str] = "width"
    legend: ClassVar[str] = "width {}"

    def present(self, v: ValidateSpec) -> bool:
        """Two widths or more, or a horizon sweep (which reads this sweep's rows at its main horizon)."""
        return len(v.widths) > 1 or bool(v.horizons())

    def trials(self, spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
        """Every (hparam, parametrization, width, value, seed), lr first; with a horizon sweep at its main
        horizon, `-t<steps>` in the key (`validate-mup-w64-t300-lr0.004-s0`), which the horizon sweep reads too."""
        from studies.plan import PlannedTrial

        v = spec.validate_
        assert v is not None
        main = spec.validate_horizon() if v.horizons() else None
        at, t = ({"horizon": main}, f"-t{main}") if main is not None else (None, "")
        return [PlannedTrial(f"validate-{p}-w{w}{t}-{h}{x:.3g}-s{s}", "validate", w, s, {**centre, h: x},
                             parametrization=p, swept=h, sweep=self.name, at=at)
                for h, values in v.sweeps().items() for p in v.parametrizations for w in v.widths
                for x in values for s in range(v.seeds)] if self.present(v) else []

    def problems(self, spec: StudySpec) -> list[str]:
        v = spec.validate_
        assert v is not None
        searched = [h for h in spec.space.searched() if h != "lr"]
        return [f"validate.hparams.{h} is not a searched hparam of this study: use one of {searched}"
                for h in v.hparams if h not in searched]

    def judge(self, spec: StudySpec, rows: pd.DataFrame, centre: Mapping[str, float], out: Artifacts) -> Judged:
        v = spec.validate_
        assert v is not None
        drifts = []
        if len(v.widths) > 1:  # one width: the horizon sweep's main rows, judged by their regret alone
            for hparam in v.sweeps():
                analysis.plot_mutransfer(rows, out.figure(figure_of(hparam)), hparam)
            drifts = [analysis.lr_drift(rows, threshold=v.drift_threshold),  # first: it names the fix for a divergence
                      *(analysis.lr_drift(rows, threshold=v.drift_threshold, hparam=h) for h in v.swept_hparams())]
        centre = {WEIGHT_DECAY: spec.train.weight_decay, **centre}  # λ: searched, else fixed
        regrets = analysis.transfer_regret(rows, centre, regret_widths(spec), hparams=[h for h in v.sweeps()
                                                                                       if centre[h]],
                                           parametrization=spec.model.parametrization,
                                           proxy_width=spec.tune.base_width)
        return Judged(drifts=drifts, regrets=regrets)

    def figures(self, drifts: Sequence[LRDrift]) -> dict[str, str]:
        return {("validate" if d.hparam == "lr" else f"validate ({d.hparam})"): figure_of(d.hparam) for d in drifts}

    def metrics(self, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> dict[str, float]:
        return {**{f"{d.hparam}_drift.{p}": x for d in drifts for p, x in d.drift.items()},
                **{f"{name}.{r.hparam}.{r.parametrization}.w{r.width}": x for r in regrets
                   for name, x in (("regret", r.regret), ("regret_pct", r.regret_pct)) if x is not None}}

    def tags(self, drifts: Sequence[LRDrift]) -> dict[str, str]:
        return {f"{d.hparam}_drift_passed": str(bool(d.passed)).lower() for d in drifts}

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        """Each hparam's drift and pass tag, and lr's regret in %."""
        from studies.phases.base import DRIFTS, PASS

        assert spec.validate_ is not None
        names = "|".join(re.escape(h) for h in spec.validate_.sweeps())
        return [*verdict.shown(PASS, "tags", rf"(?:{names})_drift_passed"),
                *verdict.shown(DRIFTS, "metrics", rf"(?:{names})_drift\.\w+"),
                *verdict.shown(DRIFTS, "metrics", r"regret_pct\.lr\..+")]

    def sentence(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
        return [*(f"{d.hparam} drift: {d.verdict}." for d in drifts), *self.lines(spec, drifts, regrets)]

    def lines(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret]) -> list[str]:
        """`analysis.regret_line` for each swept hparam with a regret, lr first."""
        return [line for h in dict.fromkeys(r.hparam for r in regrets) if (line := analysis.regret_line(regrets, h))]

    def section(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], list[str]]:
        from analysis.report import markdown_table, regret_section

        frame = decay_timescales(spec, drifts, table)
        return ([regret_section(regrets)] if regrets else [],
                [] if frame is None else [decay_words(spec), markdown_table(frame)])

    def summary(self, spec: StudySpec, drifts: Sequence[LRDrift], regrets: Sequence[Regret],
                table: pd.DataFrame | None) -> tuple[list[str], Any]:
        from rich.table import Table

        frame = decay_timescales(spec, drifts, table)
        if frame is None:
            return self.lines(spec, drifts, regrets), None
        out = Table(title=f"AdamW timescale at λ* (T = {spec.validate_horizon()} steps, "
                          f"{spec.train.weight_decay_form} form)")
        for col in frame.columns:
            out.add_column(str(col), justify="right")
        for row in frame.itertuples(index=False):
            out.add_row(*(f"{x:.3g}" if isinstance(x, float) else str(x) for x in row))
        return self.lines(spec, drifts, regrets), out


def decay_timescales(spec: StudySpec, drifts: Sequence[LRDrift], table: pd.DataFrame | None) -> pd.DataFrame | None:
    """The λ sweep's optimum as AdamW timescales per (parametrization, width) (`analysis.optimum_timescales`, over
    the validate horizon); None without a `validate.weight_decays` sweep."""
    from analysis.weight_decay import optimum_timescales

    by = {d.hparam: d for d in drifts}
    if WEIGHT_DECAY not in by or table is None:
        return None
    return optimum_timescales(table[table["sweep"] == Width.name], by[WEIGHT_DECAY], spec.validate_horizon(),
                              by.get("lr"))


def decay_words(spec: StudySpec) -> str:
    """What the λ sweep's timescales say and do not say, in one paragraph."""
    form = spec.train.weight_decay_form
    return (f"AdamW timescale at the λ sweep's optimum (train.weight_decay_form: {form}; T = "
            f"{spec.validate_horizon()} steps): τ* = 1/(η·λ*) iterations and τ*/T per width. A flat λ* (its drift "
            "above) keeps τ*/T the same at every width. Whether τ/T should stay fixed as T changes (Wang & "
            "Aitchison's rule, transfer.weight_decay: timescale) this sweep alone cannot show: compare τ*/T of "
            "sweeps at different validate.steps.")


SWEEP = Width()
Fields.sweep = SWEEP
