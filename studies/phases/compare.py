"""compare: the study's model, tuned once at a proxy width and transferred, against baselines tuned at every
parameter budget. Each family's tune search at each budget is a stage (its own restorable experiment, its best
kept in the phase's record as it finishes); then every family trains at every budget and seed on
`compare.tokens` tokens, and `analysis.compare_table` ranks them per budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
from pydantic import BaseModel
from rich.table import Table

import analysis
from analysis.report import compare_section
from analysis.table import loss_spread
from studies.arch import rebase
from studies.budget import train_flops, width_for_budget
from studies.model import ModelSpec
from studies.phases.base import Artifacts, Context, Out, Phase, PhaseResult, Stage, Verdict, required
from studies.phases.tune import best_hparams
from studies.plan import PlannedTrial
from studies.spec import StudySpec


def compare_widths(spec: StudySpec, vocab_size: int) -> dict[str, dict[str, Any]]:
    """Per family: its role, the solved width at each budget, and (the study's own model) the proxy width.

    `{family: {"role": "transferred" | "tuned", "widths": [w per budget], "proxy_width": w0 | None}}`, the
    study's model first; widths meet each budget within compare.tolerance (else a `ValueError` naming the fix).
    """
    c = required(spec.compare, Compare)
    base = spec.tune.base_width

    def solve(model: ModelSpec, budget: float) -> int:
        return width_for_budget(model.family, model.arch, budget, vocab_size, base, c.tolerance)

    out: dict[str, dict[str, Any]] = {
        spec.model.family: {"role": "transferred", "widths": [solve(spec.model, b) for b in c.budgets],
                            "proxy_width": solve(spec.model, c.proxy())}}
    for b in c.baselines:
        out[b.model.family] = {"role": "tuned", "widths": [solve(b.model, x) for x in c.budgets], "proxy_width": None}
    return out


def compare_sub_spec(spec: StudySpec, family: str, width: int) -> StudySpec:
    """The tune-only study one compare stage runs: `family` tuned at `width`, which becomes its μP base.

    The study's own model keeps its arch, rebased to the proxy width (PT's sizes are given at the base width);
    a baseline takes its entry's model, space and num_trials. Tune trials see compare.tune_tokens, and
    `train.steps` is the final runs' (compare.tokens), so `trial_config(..., steps=None)` gives a final run.
    """
    c = required(spec.compare, Compare)
    data = spec.as_dict()
    data.update(compare=None, transfer=None, verify=None, validate=None)
    data["tune"] = {**data["tune"], "base_width": width, "steps": spec.steps_for("tune")}
    data["train"] = {**data["train"], "steps": spec.steps_for("compare")}
    if family == spec.model.family:
        arch = rebase(spec.model.arch, spec.tune.base_width, width)
        data["model"] = {**data["model"], "arch": arch.model_dump(mode="json")}
    else:
        entry = next((b for b in c.baselines if b.model.family == family), None)
        if entry is None:
            raise ValueError(f"family {family!r} is not in this compare study: choose one of "
                             f"{[spec.model.family, *(b.model.family for b in c.baselines)]}")
        data["model"] = entry.model.model_dump(mode="json")
        data["space"] = entry.space.model_dump(mode="json")
        data["tune"]["num_trials"] = entry.num_trials
    return StudySpec.model_validate(data)


@dataclass(frozen=True)
class CompareStage(Stage):
    """One family's tune search at one budget (the study's own model: once, at its proxy width)."""

    family: str
    budget: float

    @property
    def width(self) -> int:
        return self.spec.tune.base_width


def compare_stages(spec: StudySpec, vocab_size: int) -> list[CompareStage]:
    """The tune stages: the study's model once at its proxy width, each baseline at every budget's width."""
    c, stages = required(spec.compare, Compare), []
    for family, info in compare_widths(spec, vocab_size).items():
        if info["role"] == "transferred":
            points = [(c.proxy(), info["proxy_width"], "proxy")]
        else:
            points = [(budget, w, f"b{i}") for i, (budget, w) in enumerate(zip(c.budgets, info["widths"], strict=True))]
        for budget, width, tag in points:
            name = f"{family}-{tag}"
            tags = {"phase": "compare", "stage": f"tune-{name}", "family": family, "budget": budget}
            stages.append(CompareStage(name, compare_sub_spec(spec, family, width), f"compare_tune_{name}", tags,
                                       family, budget))
    return stages


def compare_trials(spec: StudySpec, vocab_size: int, best: dict[str, dict[str, float]]) -> list[PlannedTrial]:
    """The final runs: every family at every budget and seed, on compare.tokens tokens.

    `best` maps stage name (`compare_stages`) → the stage's best hparams; the study's model uses its proxy
    stage's hparams at every budget (zero-shot, μP base at the proxy width), each baseline its budget's own.
    Each trial carries its full `config` (a trial config dict) and its computed `train_flops`.
    """
    c, trials = required(spec.compare, Compare), []
    for family, info in compare_widths(spec, vocab_size).items():
        for i, (budget, width) in enumerate(zip(c.budgets, info["widths"], strict=True)):
            stage = f"{family}-proxy" if info["role"] == "transferred" else f"{family}-b{i}"
            sub = compare_sub_spec(spec, family, info["proxy_width"] if info["role"] == "transferred" else width)
            hparams = sub.space.complete(best[stage])
            steps = spec.steps_for("compare")
            flops = train_flops(family, sub.model.arch, width, vocab_size, spec.data.seq_len, spec.data.mask_rate,
                                steps * spec.train.batch_size, sub.tune.base_width)
            for seed in range(c.seeds):
                trials.append(PlannedTrial(f"compare-{family}-b{i}-s{seed}", "compare", width, seed, hparams,
                                       family=family, budget=budget, role=info["role"], tuned_at=stage,
                                       train_flops=flops, parametrization=sub.model.parametrization,
                                       config=sub.trial_config(width, hparams, seed, steps)))
    return trials


class StageBest(BaseModel):
    best_hparams: dict[str, float]
    width: int


class CompareResult(PhaseResult):
    stages: dict[str, StageBest] = {}  # stage name → its tune search's winner (kept as each stage finishes)
    vocab_size: int | None = None
    widths: dict[str, dict[str, Any]] = {}  # `studies.plan.compare_widths`
    summary: list[dict[str, Any]] = []  # `analysis.compare_table`'s rows
    budgets: list[float] = []
    tokens: int | None = None


def _record(ctx: Context) -> CompareResult:
    record = ctx.state.phases.setdefault("compare", CompareResult())
    assert isinstance(record, CompareResult)
    return record


class Compare(Phase):
    name: ClassVar[str] = "compare"
    result: ClassVar[type[PhaseResult]] = CompareResult
    how_to_add: ClassVar[str] = "add one with budgets, tokens and baselines"

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is not None

    def stages(self, ctx: Context) -> list[Stage]:
        return list(compare_stages(ctx.spec, ctx.vocab_size()))

    def stage_done(self, ctx: Context, stage: Stage, table: pd.DataFrame) -> None:
        _record(ctx).stages[stage.name] = StageBest(best_hparams=best_hparams(stage.spec, table),
                                                    width=stage.spec.tune.base_width)

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        best = {name: stage.best_hparams for name, stage in _record(ctx).stages.items()}
        return compare_trials(ctx.spec, ctx.vocab_size(), best)

    def count(self, spec: StudySpec) -> int:
        c = required(spec.compare, Compare)
        finals = (1 + len(c.baselines)) * len(c.budgets) * c.seeds
        return spec.tune.num_trials + sum(b.num_trials for b in c.baselines) * len(c.budgets) + finals

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> CompareResult:
        spec, c = ctx.spec, required(ctx.spec.compare, Compare)
        tunes = [ctx.tables(stage.table) for stage in self.stages(ctx)]
        pd.concat(tunes, ignore_index=True).to_csv(out.artifact("compare_tune_trials.csv"), index=False)
        summary = analysis.compare_table(table)
        summary.to_csv(out.artifact("compare_summary.csv"), index=False)
        analysis.plot_compare(table, out.figure("compare"))
        vocab = ctx.vocab_size()
        return CompareResult(stages=_record(ctx).stages, vocab_size=vocab, widths=compare_widths(spec, vocab),
                             summary=summary.to_dict(orient="records"), budgets=c.budgets, tokens=c.tokens)

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {"compare": "compare"}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        return Verdict()

    def about(self, spec: StudySpec, result: PhaseResult | None) -> dict[str, Any]:
        c, widths = required(spec.compare, Compare), result.widths if isinstance(result, CompareResult) else {}
        return {"families": [spec.model.family, *(b.model.family for b in c.baselines)], "budgets": c.budgets,
                "tokens": c.tokens, "budget": f"{spec.steps_for('compare')} steps × batch {spec.train.batch_size}",
                "widths": {f: info["widths"] for f, info in widths.items()}}

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        return [compare_section(tables["compare"])] if "compare" in tables else []

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        """Every family at every budget (`analysis.compare_table`'s rows, best first within a budget)."""
        if not isinstance(result, CompareResult) or not result.summary:
            return
        table = Table(title=f"eval loss per parameter budget ({result.tokens:,} training tokens a run)")
        for col in ("budget", "family", "role", "width", "params", "eval loss (seeds)", "rank"):
            table.add_column(col, justify="left" if col in ("family", "role") else "right")
        for row in result.summary:
            loss = loss_spread(row["eval_loss_mean"], row["eval_loss_std"])
            loss += f" ({row['n_seeds']}" + (f", {row['n_diverged']} diverged)" if row["n_diverged"] else ")")
            table.add_row(f"{row['budget']:,.0f}", row["family"], row["role"], str(row["width"]),
                          f"{row['params']:,}" if row["params"] is not None else "—", loss, str(row["rank"]))
        out.print(table)


PHASE = Compare()
