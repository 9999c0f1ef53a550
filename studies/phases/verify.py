"""verify: the local-optimality certificate. The transferred centre (with `centre_seeds` seeds) and N samples
drawn around it train at the verify width; `analysis.certify` judges how many samples beat the centre and
the one-sided binomial bound on the centre's rank. Centre runs that a transfer run already made (same width,
seed and steps) are copied from the transfer table instead of trained again.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import pandas as pd

import analysis
from analysis import Certificate, certify, neighbour_advice
from analysis.report import verify_section
from studies.phases.base import COUNTS, PASS, Artifacts, Context, Out, Phase, PhaseResult, Verdict, required
from studies.phases.transfer import carried_hparams
from studies.plan import PlannedTrial
from studies.spec import StudySpec


class VerifyResult(PhaseResult):
    certificate: Certificate | None = None


def verify_trials(spec: StudySpec, centre: dict[str, float], skip_centre_seeds: Collection[int] = ()
                  ) -> list[PlannedTrial]:
    """The centre with `centre_seeds` seeds (but `skip_centre_seeds`: runs reused from transfer), then N samples
    around it at the verify width.

    Each searched hparam is drawn independently and uniformly in [(1-δ)x, (1+δ)x] (`sampling: log`:
    uniformly in log space over the same interval); frozen hparams stay at the centre. Samples
    train with `verify.seed`, the centre's first seed, so they differ from it by hparams alone.
    The draw is seeded by `verify.seed`: a restarted phase plans the same samples.
    """
    v = required(spec.verify, Verify)
    width, delta = spec.verify_width(), v.delta
    trials = [PlannedTrial(f"verify-centre-s{s}", "verify", width, v.seed + s, dict(centre), is_centre=True)
              for s in range(v.centre_seeds) if v.seed + s not in skip_centre_seeds]
    rng = random.Random(v.seed)
    searched = list(spec.space.searched())  # in the family's hparam order
    for i in range(v.resolved_n_samples()):
        sample = dict(centre)
        for h in searched:
            lo, hi = (1 - delta) * centre[h], (1 + delta) * centre[h]
            sample[h] = math.exp(rng.uniform(math.log(lo), math.log(hi))) if v.sampling == "log" \
                else rng.uniform(lo, hi)
        trials.append(PlannedTrial(f"verify-sample{i:03d}", "verify", width, v.seed, sample))
    return trials


def reused_centre_seeds(spec: StudySpec) -> list[int]:
    """The verify centre's seeds whose run is a transfer run already: same width, seed and steps (and the same
    centre hparams, the tune winner, by construction). The verify phase copies those rows instead of training."""
    v, t = spec.verify, spec.transfer
    if v is None or t is None or spec.verify_width() not in t.widths or spec.steps_for("verify") != spec.steps_for(
            "transfer"):
        return []
    return [v.seed + s for s in range(v.centre_seeds) if v.seed + s < t.seeds]


def with_reused_centre(spec: StudySpec, verify: pd.DataFrame, transfer: pd.DataFrame) -> pd.DataFrame:
    """The verify table with the reused centre runs (`reused_centre_seeds`) copied in from the transfer table as
    `verify-centre-s<k>` rows, is_centre True, their `message` naming the transfer run."""
    width, seeds = spec.verify_width(), reused_centre_seeds(spec)
    rows = transfer[(transfer["width"] == width) & transfer["seed"].isin(seeds)].copy()
    if rows.empty or spec.verify is None:  # no reused seeds without a verify section
        return verify
    source = rows["trial_id"].astype(str)
    rows["phase"], rows["is_centre"] = "verify", True
    rows["trial_id"] = [f"verify-centre-s{s - spec.verify.seed}" for s in rows["seed"]]
    rows["message"] = "reused from " + source
    return pd.concat([rows, verify], ignore_index=True).sort_values("trial_id", kind="stable", ignore_index=True)


def verify_centre(ctx: Context) -> dict[str, float]:
    """The transferred centre as the verify width trains it: tune's winner, λ carried by `transfer.weight_decay`
    (`studies.phases.transfer.carried_hparams`) to the verify trials' steps."""
    return carried_hparams(ctx.spec, ctx.state.centre(), "verify")


def _advice(ctx: Context, cert: Certificate, table: pd.DataFrame | None) -> str | None:
    """Where an uncertified centre's better neighbours lie (`analysis.neighbour_advice`); None: nothing to say."""
    if cert.certified or table is None or not ctx.state.done("tune"):
        return None
    return neighbour_advice(table, verify_centre(ctx), list(ctx.spec.space.searched()), cert.tolerance,
                            alpha=cert.alpha).text


class Verify(Phase):
    name: ClassVar[str] = "verify"
    result: ClassVar[type[PhaseResult]] = VerifyResult
    how_to_add: ClassVar[str] = "add verify: {}"
    told: ClassVar[int] = 2
    pictured: ClassVar[int] = 2

    def present(self, spec: StudySpec) -> bool:
        return spec.compare is None and spec.verify is not None

    def plan(self, ctx: Context) -> list[PlannedTrial]:
        reused = reused_centre_seeds(ctx.spec) if ctx.tables("transfer") is not None else []
        return verify_trials(ctx.spec, verify_centre(ctx), reused)

    def planned(self, spec: StudySpec) -> list[PlannedTrial]:
        return verify_trials(spec, spec.space.defaults())

    def completed(self, ctx: Context, table: pd.DataFrame) -> pd.DataFrame:
        transfer = ctx.tables("transfer")
        return table if transfer is None else with_reused_centre(ctx.spec, table, transfer)

    def judge(self, ctx: Context, table: pd.DataFrame, out: Artifacts) -> VerifyResult:
        v = required(ctx.spec.verify, Verify)
        cert = certify(table, p=v.p, alpha=v.alpha, tolerance=v.tolerance)
        out.write_artifact("certificate.json", cert.model_dump())
        analysis.plot_verify(table, verify_centre(ctx), list(ctx.spec.space.searched()), out.figure("verify"),
                             cert.tolerance)
        return VerifyResult(certificate=cert)

    def figures(self, result: PhaseResult) -> dict[str, str]:
        return {"verify": "verify"}

    def verdict(self, spec: StudySpec, result: PhaseResult) -> Verdict:
        assert isinstance(result, VerifyResult) and result.certificate is not None
        c = result.certificate
        metrics: dict[str, Any] = {"step": 0, "upper_bound": c.upper_bound, "n_better": c.n_better,
                                   "centre_rank": c.centre_rank, "n_samples": c.n_samples,
                                   "centre_loss": c.centre_loss}
        if c.noise_better_expected is not None:  # None: one centre seed
            metrics["noise_better_expected"] = c.noise_better_expected
        if c.best_lead is not None:  # None: every sample diverged (or a certificate from before the field)
            metrics.update(best_lead=c.best_lead, best_lead_pct=c.best_lead_pct)
        return Verdict({"verify_width": spec.verify_width()}, [metrics], {"certified": str(bool(c.certified)).lower()},
                       sentence=f"Certificate: {c.verdict}.")

    def columns(self, spec: StudySpec, verdict: Verdict) -> list[tuple[int, str]]:
        return [*verdict.shown(PASS, "tags", "certified"),
                *verdict.shown(COUNTS, "metrics", "upper_bound|n_better|centre_rank|best_lead_pct")]

    def section(self, ctx: Context, result: PhaseResult, tables: Mapping[str, pd.DataFrame]) -> list[str]:
        assert isinstance(result, VerifyResult) and result.certificate is not None
        cert, advice = result.certificate, _advice(ctx, result.certificate, tables.get("verify"))
        return [verify_section(cert), *([f"**where the better neighbours lie:** {advice}"] if advice else [])]

    def summary(self, ctx: Context, result: PhaseResult | None, out: Out, runs: Mapping[str, str]) -> None:
        cert = result.certificate if isinstance(result, VerifyResult) else None
        if cert is not None:
            out.print(f"[{'green' if cert.certified else 'yellow'}]certificate:[/] {cert.verdict}", soft_wrap=True)
        if cert is not None and (advice := _advice(ctx, cert, ctx.tables("verify"))):
            out.print(f"where the better neighbours lie: {advice}", soft_wrap=True)


PHASE = Verify()
