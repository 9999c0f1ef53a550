"""validate: the μTransfer evidence. Short sweeps of lr (and of each of `validate.hparams`) at 2–4 widths under
each parametrization, the other hparams at the centre; `analysis.lr_drift` measures how far the optimum moves
per doubling of width and passes it against `validate.drift_threshold`, and `analysis.transfer_regret` what the
transferred values cost at each swept width that was transferred to (`regret_widths`)."""

from __future__ import annotations

from typing import ClassVar

import pandas as pd

from analysis import LRDrift, Regret, lr_drift, plot_mutransfer, regret_line, transfer_regret
from studies.phases.base import Artifacts, Context, Phase, PhaseResult, Verdict
from studies.plan import PlannedTrial
from studies.spec import StudySpec, required


class ValidateResult(PhaseResult):
    lr_drift: LRDrift | None = None
    hparam_drift: dict[str, LRDrift] = {}  # each of validate.hparams
    regret: list[Regret] = []  # per swept hparam, parametrization and transferred width (`regret_widths`)

    def drifts(self) -> dict[str, LRDrift]:
        """lr's drift, then each other swept hparam's."""
        return {**({"lr": self.lr_drift} if self.lr_drift else {}), **self.hparam_drift}


def validate_trials(spec: StudySpec, centre: dict[str, float]) -> list[PlannedTrial]:
    """The sweeps: lr's, then each of `validate.hparams`: every (parametrization, width, value, seed) of the swept
    hparam, the other hparams at the centre."""
    v = required(spec.validate_, "validate")
    return [PlannedTrial(f"validate-{p}-w{w}-{h}{x:.3g}-s{s}", "validate", w, s, {**centre, h: x}, parametrization=p,
                         swept=h)
            for h, values in v.sweeps().items()
            for p in v.parametrizations for w in v.widths for x in values for s in range(v.seeds)]


def regret_widths(spec: StudySpec) -> list[int]:
    """The swept widths the study transferred to: those in both `transfer.widths` and `validate.widths`, and the
    tune base width when it is swept."""
    v = required(spec.validate_, "validate")
    transferred = {spec.tune.base_width, *(spec.transfer.widths if spec.transfer is not None else [])}
    return [w for w in v.widths if w in transferred]


def regret_lines(result: ValidateResult) -> list[str]:
    """`analysis.regret_line` for each swept hparam with a regret, lr first."""
    hparams = dict.fromkeys(r.hparam for r in result.regret)
    return [line for h in hparams if (line := regret_line(result.regret, h))]


def _figure(hparam: str) -> str:
    return "mutransfer" if hparam == "lr" else f"mutransfer_{hparam}"


class Validate(Phase):
    name: ClassVar[str] = "validate"
    result: ClassVar[type[PhaseResult]] = ValidateResult

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        return validate_trials(ctx.spec, ctx.centre())

    def count(self, spec: StudySpec) -> int:
        return len(validate_trials(spec, spec.space.defaults()))

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> ValidateResult:
        v = required(ctx.spec.validate_, "validate")
        for hparam in v.sweeps():
            plot_mutransfer(table, out.figure(_figure(hparam)), hparam)
        drift = lr_drift(table, threshold=v.drift_threshold)  # first: it names the fix for a sweep that diverged
        hparam_drift = {h: lr_drift(table, threshold=v.drift_threshold, hparam=h) for h in v.hparams}
        regret = transfer_regret(table, ctx.centre(), regret_widths(ctx.spec), hparams=list(v.sweeps()),
                                 parametrization=ctx.spec.model.parametrization, proxy_width=ctx.spec.tune.base_width)
        return ValidateResult(lr_drift=drift, hparam_drift=hparam_drift, regret=regret)

    def figures(self, result: PhaseResult) -> dict[str, str]:
        assert isinstance(result, ValidateResult)
        return {"validate": "mutransfer", **{f"validate ({h})": _figure(h) for h in result.hparam_drift}}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, ValidateResult)
        drifts = result.drifts()
        regret = {f"{name}.{r.hparam}.{r.parametrization}.w{r.width}": value for r in result.regret
                  for name, value in (("regret", r.regret), ("regret_pct", r.regret_pct)) if value is not None}
        return Verdict(metrics=[{"step": 0, **{f"{h}_drift.{p}": v for h, d in drifts.items()
                                                for p, v in d.drift.items()}, **regret}],
                       tags={f"{h}_drift_passed": str(bool(d.passed)).lower() for h, d in drifts.items()},
                       sentence=" ".join([*(f"{h} drift: {d.verdict}." for h, d in drifts.items()),
                                          *regret_lines(result)]))


PHASE = Validate()
