"""`StudySpec`: one hyperparameter-transfer study, end to end (docs/studies.md, "How a study flows").

The same pydantic model is read from YAML by the CLI, accepted as JSON by the API, handed to Ray,
logged to MLflow and echoed in the report. Every model is strict (`extra="forbid"`: an unknown
key fails with its field path) and frozen (change a spec with `model_copy(update=...)`).

The workers use these models directly (`studies` imports no torch, the workers import `studies`): the model
configs of `studies.arch` build the models, `DataSpec` the data, `TrialConfig` (`TrainSpec` plus the model, data,
lr and seed) one trial. `StudySpec.trial_config` builds the plain dict that `TrialConfig.model_validate` takes.

Two kinds of study: a transfer study (tune → transfer → verify → validate, the μP-PT paper's §3.1), and a
compare study (a `compare` section: families at equal parameter budgets, §3.2), which runs the one phase
`compare`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)

from analysis import min_samples
from studies.arch import (
    DepthArch,
    DepthParametrization,
    Later,
    LaterFields,
    Optimizer,
    Parametrization,
    PosInt,
    Widths,
    context_error,
    mup_error,
    nested,
    width_error,
    without_later_defaults,
)
from studies.compare_spec import BaselineSpec, CompareSpec
from studies.family import FAMILIES, get_family
from studies.model import ModelFamily, ModelSpec, validate_space
from studies.schema import FamilySpace, by_family
from studies.space import WEIGHT_DECAY
from studies.sweeps import ValidateSpec

__all__ = ["CATALOG_DIR", "AshaSpec", "BaselineSpec", "CompareSpec", "DataSpec", "ModelFamily", "ModelSpec",
           "Parametrization", "ResourcesSpec", "StudySpec", "TrackingSpec", "TrainSpec", "TransferSpec", "TrialConfig",
           "TuneSpec", "ValidateSpec", "VerifySpec", "width_error"]

CATALOG_DIR = Path(__file__).parent / "catalog"


def _objective(family: Any) -> str:
    """The data objective of `family` ("mlm" for a name the family field will reject)."""
    return FAMILIES[family].objective if isinstance(family, str) and family in FAMILIES else "mlm"


_STRICT = ConfigDict(extra="forbid", frozen=True)
NonNegInt = Annotated[int, Field(ge=0)]


class DataSpec(BaseModel):
    """The training data (what `workers.data.prepare` builds and caches)."""

    model_config = _STRICT

    source: Literal["shakespeare", "text", "jsonl", "hf"] = Field(
        "shakespeare", description="'shakespeare' (built in), 'text' (.txt), 'jsonl' or 'hf' (HF datasets)")
    path: str | None = Field(None, description="text/jsonl: file, directory or glob; hf: a dataset")
    hf_config: str | None = Field(None, description="hf: the dataset's configuration, if it has several")
    hf_split: str = Field("train", min_length=1, description="hf: the split read (train and eval)")
    text_field: str = Field("text", min_length=1, description="jsonl/hf: the field holding the text")
    tokenizer: Literal["word", "wordpiece", "bpe"] = Field("word", description="trained on the train split")
    vocab_size: int = Field(10000, ge=4, description="cap, specials included (bpe: >= 260)")
    seq_len: int = Field(64, ge=2, description="tokens per sequence: at most the arch's context (max_len), and "
                         "small enough that the largest trial's training memory fits the machine (studies.members)")
    packing: Literal["stream", "lines"] = Field("stream", description="'stream' (seq_len blocks) or 'lines'")
    objective: Literal["mlm", "clm"] = Field(
        "mlm", description="'mlm' (masked tokens) or 'clm' (next tokens; mask_rate and mask_mode unused): the model "
        "family's own (PT, BERT, UT: mlm; TauGPT and causal plugins: clm); omitted: the family's")
    mask_rate: float = Field(0.15, gt=0, lt=1, description="chance each real token is masked (μP-PT: 0.15)")
    mask_mode: Literal["mask", "80-10-10"] = Field("mask", description="'mask' (PT paper) or '80-10-10'")
    eval_fraction: float = Field(0.05, gt=0, lt=1, description="share of text units (streaming: documents) held out")
    max_eval_sequences: int = Field(512, ge=1, description="cap on eval sequences")
    max_tokens: int | None = Field(None, ge=1, description="cap on words read (streaming: the tokenizer's words)")
    streaming: bool = Field(False, description="jsonl only: train rows packed live from the files, epoch after epoch")
    stream_val_every: NonNegInt = Field(0, description="k: every k-th train batch goes to validation; 0: none")
    seed: NonNegInt = Field(0, description="seeds the split and the eval masks")

    @model_validator(mode="after")
    def _check(self) -> DataSpec:
        if self.source == "shakespeare" and self.path:
            raise ValueError("data.path must be empty with source 'shakespeare'; for files use source: text")
        if self.source != "shakespeare" and not self.path:
            example = "JeanKaddour/minipile" if self.source == "hf" else "corpus/*.txt"
            raise ValueError(f"data.path is required with source {self.source!r}, e.g. path: {example}")
        if self.streaming and self.source != "jsonl":
            raise ValueError(f"data.streaming needs source jsonl, not {self.source!r}: set source: jsonl with "
                             "path: corpus/*.jsonl, or streaming: false")
        if self.stream_val_every == 1:
            raise ValueError("data.stream_val_every=1 would divert every train batch to validation: use 0 (none) "
                             "or an integer >= 2, e.g. 20")
        if self.tokenizer == "bpe" and self.vocab_size < 260:
            raise ValueError(f"data.vocab_size={self.vocab_size} must be >= 260 with tokenizer bpe "
                             "(3 specials + 256 byte symbols)")
        return self


MUON_KNOBS = ("muon_momentum", "muon_nesterov", "muon_ns_steps", "muon_adjust_lr")  # train.optimizer: muon only


class TrainSpec(LaterFields):
    """The training budget of one trial (`TrialConfig` adds the model, data, lr and seed)."""

    model_config = _STRICT
    later: ClassVar[Later] = (("adam_eps",), ("adam_eps_scaling",), ("weight_decay_groups",), ("weight_decay_form",),
                              ("optimizer",), *((knob,) for knob in MUON_KNOBS))

    steps: PosInt = Field(200, description="optimizer steps (tune/verify/validate may override)")
    batch_size: PosInt = Field(32, description="sequences per step")
    weight_decay: float = Field(
        0.0, ge=0, description="AdamW weight decay, in every parameter group but bias and block_bias, where every "
        "built-in and from_mup family keeps its biases and norm gains (train.weight_decay_groups overrides a group)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    adam_eps: float | None = Field(
        None, gt=0, lt=1, description="Adam's ε (a depth parametrization's blocks scale it); null: the family's "
        "default (`Family.adam_eps`, the built-ins' 1e-8)")
    adam_eps_scaling: Literal["none", "width"] = Field(
        "none", description="'width': ε × base_width/width in the groups whose lr μP divides by width_mult (the "
        "built-ins' hidden and block, PT's hidden and output, a from_mup family's matrix groups), whatever the "
        "parametrization; 'none': one ε")
    weight_decay_groups: dict[str, Annotated[float, Field(ge=0)]] | None = Field(
        None, max_length=16, description="weight decay per parameter group, overriding weight_decay "
        "(and the undecayed bias groups) for the groups named, e.g. {hidden: 0.1, input: 0} (a from_mup family: "
        "matrix, vector, bias); null: weight_decay")
    weight_decay_form: Literal["coupled", "independent"] = Field(
        "coupled", description="'coupled': torch's AdamW, a group's decay per step is its own lr × λ (μP's hidden "
        "groups, at lr/width_mult, decay less as width grows); 'independent': each group's λ is scaled so that its "
        "lr × λ is the base lr × λ, the same decay per step in every group at every width")
    optimizer: Optimizer = Field(
        "adamw", description="'adamw': AdamW in every parameter group; 'muon': Muon (orthogonalised momentum) on the "
        "hidden matrices (each family's hidden and block groups, `LanguageModel.matrices`), AdamW (betas, adam_eps) "
        "on the embeddings, readout and vectors beside them; μP for each: docs/mup.md")
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="Muon's momentum μ (torch.optim.Muon's default)")
    muon_nesterov: bool = Field(True, description="Muon: Nesterov momentum (g + μB) instead of B")
    muon_ns_steps: int = Field(5, ge=1, le=99, description="Muon: Newton–Schulz iterations (torch's limit: < 100)")
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw", description="Muon's per-matrix lr factor at the base width (torch's adjust_lr_fn): "
        "'match_rms_adamw', 0.2·√max(fan_out, fan_in), AdamW's update RMS, so one lr serves both optimisers; "
        "'original', √max(1, fan_out/fan_in); mup scales it by the spectral condition (docs/mup.md)")
    warmup_steps: NonNegInt = Field(10, description="linear warmup steps")
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="the lr after warmup")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / peak lr (cosine, linear)")
    plateau_patience: NonNegInt = Field(
        0, description="evals without a new best eval loss before the lr is scaled by plateau_factor; 0: off")
    plateau_factor: float = Field(0.5, gt=0, lt=1, description="the plateau's lr scale (TauGPT post: halvings)")
    grad_clip: float = Field(5.0, ge=0, description="gradient-norm clip (PT paper: 5); 0 disables")
    t_l2: float = Field(0.0, ge=0, description="coefficient of the unsquared ‖T‖_F penalty (PT paper: 5e-4)")
    eval_every: PosInt = Field(50, description="steps between evaluations (ASHA sees these)")
    eval_batches: PosInt = Field(8, description="cap on fixed held-out batches per evaluation")
    log_every: PosInt = Field(10, description="steps between logged training metrics")
    max_loss: float = Field(1e3, gt=0, description="a finite loss above this also counts as diverged")
    uniform_margin: float | None = Field(
        1.0, description="an eval loss above ln|V| (uniform prediction) + this many nats is recorded diverged "
        "(above the untrained loss + this, when the model starts above ln|V|); null: off")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="'auto': cuda when available")

    @field_validator("betas", mode="before")
    @classmethod
    def _betas_list(cls, betas: Any) -> Any:
        """A JSON/YAML list is a pair too, also in strict mode (the API's), where only a tuple would be."""
        return tuple(betas) if isinstance(betas, list) else betas

    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"each beta must lie in [0, 1), e.g. [0.9, 0.999]; got {list(betas)}")
        return betas

    @model_validator(mode="after")
    def _muon_knobs_need_muon(self) -> TrainSpec:
        given = [n for n in MUON_KNOBS if getattr(self, n) != TrainSpec.model_fields[n].default]
        if given and self.optimizer != "muon":
            raise ValueError(f"train.{given[0]} is a knob of Muon, but train.optimizer is {self.optimizer!r}: set "
                             f"train.optimizer: muon, or drop train.{given[0]}")
        return self


class TrialConfig(TrainSpec):
    """One trial as a worker trains it (`workers.train.train_trial`): `TrainSpec`'s budget (with the phase's
    `steps`), the model family, the model config's keyword arguments but `vocab_size` (`model_hp`: the arch,
    width, base_width, parametrization and the hparams but lr; `build_model` validates them with the family's
    config, registered in `studies.family`), the data, the base `lr` and the `seed`.

    `StudySpec.trial_config` builds it as a plain dict, which is what Ray hands a trial."""

    model: ModelFamily = Field("pt", description="the model family")
    model_hp: dict[str, Any] = Field(default_factory=dict, description="the model config's kwargs but vocab_size")
    data: DataSpec = Field(default_factory=DataSpec, description="the training data")
    lr: float = Field(1e-2, gt=0, description="base learning rate; μP multiplies it per parameter group")
    seed: NonNegInt = Field(0, description="seeds the model's init and the train batches")


class AshaSpec(BaseModel):
    """ASHA early stopping for the tune phase (Ray Tune's ASHAScheduler; time in steps)."""

    model_config = _STRICT

    enabled: bool = Field(True, description="False: every tune trial runs to the end")
    grace_steps: PosInt = Field(50, description="steps every trial runs before it may be stopped")
    reduction_factor: float = Field(3, gt=1, description="keep the best 1/reduction_factor at each rung")


class TuneSpec(LaterFields):
    """The tune phase: a TPE search of `space` at `base_width`."""

    model_config = _STRICT
    later: ClassVar[Later] = (("batch_size",),)

    base_width: PosInt = Field(description="the proxy width the hparams are tuned at (d0): a width the arch builds "
                               "at (TauGPT: a multiple of head_dim · kv_group; nanoGPT: of n_heads)")
    num_trials: PosInt = Field(16, description="trials sampled by the searcher")
    max_concurrent: PosInt = Field(2, description="trials running at once")
    searcher: Literal["tpe"] = Field("tpe", description="Optuna's TPE through Ray Tune's OptunaSearch")
    seed: NonNegInt = Field(0, description="the searcher's seed")
    asha: AshaSpec = Field(default_factory=AshaSpec, description="early stopping of poor trials")
    steps: PosInt | None = Field(None, description="override train.steps for tune trials")
    batch_size: PosInt | None = Field(
        None, description="sequences per step of the tune trials; null: train.batch_size (smaller is flagged: the "
        "lr optimum may move with the batch, measured by validate.batch_sizes)")


class TransferSpec(LaterFields):
    """The transfer phase: the tuned hparams, unchanged, at each wider width."""

    model_config = _STRICT
    later: ClassVar[Later] = (("weight_decay",),)

    widths: Widths = Field(min_length=1, description="each > tune.base_width, increasing")
    seeds: PosInt = Field(1, description="training seeds per width")
    weight_decay: Literal["constant", "timescale"] = Field(
        "constant", description="how AdamW's λ carries to the target: 'constant', unchanged; 'timescale', scaled by "
        "the tune trials' steps / the target's (λ·T_proxy/T_target, the same η), so that the decay timescale "
        "τ = 1/(ηλ) stays the same fraction of the run")


MAX_DERIVED_SAMPLES = 100_000  # the most verify samples p and alpha may ask for (n_samples: the service's limit)


class VerifySpec(BaseModel):
    """The verify phase: N samples around the transferred centre → the certificate (PT spec §3.6)."""

    model_config = _STRICT

    width: PosInt | None = Field(None, description="the verify width; None: the largest transfer width")
    n_samples: PosInt | None = Field(
        None, description="N; None: the least N with 1-(1-p)^N >= 1-alpha (59 at p=alpha=0.05; paper: 62)")
    p: float = Field(0.05, gt=0, lt=1, description="the top fraction the centre is claimed to lie in")
    alpha: float = Field(0.05, gt=0, lt=1, description="1 - the confidence level")
    delta: float = Field(0.5, gt=0, lt=1, description="each hparam x is drawn in [(1-δ)x, (1+δ)x] (δ is [?])")
    sampling: Literal["linear", "log"] = Field("linear", description="uniform in x, or in log x, there")
    centre_seeds: PosInt = Field(3, description="seeds of the unperturbed centre (its seed spread)")
    tolerance: Literal["seed_spread", "seed_noise"] | Annotated[float, Field(ge=0, lt=1)] = Field(
        "seed_spread", description="margin a sample must beat the centre by: the centre's seed sd s, 'seed_noise' "
        "(2·s·√(1+1/centre_seeds)) or a relative float (0.004 = the paper's 0.4%)")  # rates: docs/certificate.md
    seed: NonNegInt = Field(0, description="seeds the sampling of the N perturbed points")
    steps: PosInt | None = Field(None, description="override train.steps for verify trials")

    @model_validator(mode="after")
    def _derived_n_is_bounded(self) -> VerifySpec:
        n = math.log(self.alpha) / math.log1p(-self.p)  # min_samples' ratio, before rounding (inf for a tiny p)
        if self.n_samples is None and n > MAX_DERIVED_SAMPLES:
            raise ValueError(f"verify.p={self.p:g} at alpha={self.alpha:g} needs N={n:,.0f} samples (1-(1-p)^N >= "
                             f"1-alpha), over {MAX_DERIVED_SAMPLES:,}: raise verify.p or alpha, or give n_samples")
        return self

    @model_validator(mode="after")
    def _spread_needs_seeds(self) -> VerifySpec:
        if self.tolerance in ("seed_spread", "seed_noise") and self.centre_seeds < 2:
            raise ValueError(f"verify.tolerance {self.tolerance!r} needs verify.centre_seeds >= 2 (one seed has no "
                             "spread): raise centre_seeds or give a relative tolerance such as 0.004")
        return self

    def resolved_n_samples(self) -> int:
        """N: `n_samples`, or the least N certifying top-p at confidence 1-alpha (eq. 9)."""
        return self.n_samples if self.n_samples is not None else min_samples(self.p, self.alpha)


class TrackingSpec(BaseModel):
    """Where MLflow records the study."""

    model_config = _STRICT

    experiment: str | None = Field(None, min_length=1, description="MLflow experiment; None: the study name")
    tracking_uri: str | None = Field(
        None, description="None: $MLFLOW_TRACKING_URI, else the embedded SQLite store in the data directory")


class ResourcesSpec(BaseModel):
    """Resources per trial (Ray) and the tracking target."""

    model_config = _STRICT

    cpus_per_trial: float = Field(1, ge=0.25, description="CPUs per trial, at least 0.25 (four trials to a CPU); "
                                  "the trials running at once are also capped by the cluster's memory")
    gpus_per_trial: float = Field(0, ge=0, description="GPUs per tune trial; fractions (0.25) allowed")
    transfer_gpus: float | None = Field(
        None, ge=0, description="GPUs per transfer/verify/validate trial; None: 1 if any GPU, else 0")
    max_retries: int = Field(
        2, ge=0, le=10, description="times a trial whose worker dies (killed, node lost) is restarted from its last "
        "checkpoint before it is recorded failed; 0: never")
    checkpoint_every_s: float = Field(
        30, ge=0, description="seconds of training between a trial's checkpoints, each a fixed-cost Tune snapshot "
        "(a restart redoes at most this much); 0: at every evaluation")
    storage: str | None = Field(
        None, description="where Tune keeps experiment state and checkpoints, reached by every Ray node: an "
        "absolute path mounted alike on each (/mnt/nfs/ptctl) or an S3 URI (credentials from each node's AWS "
        "environment); None: PTCTL_STORAGE, else the study's folder")  # details: docs/cluster.md
    batch_members: PosInt | Literal["auto"] = Field(
        "auto", description="trials of a transfer, verify or validate phase trained together as one batched model "
        "(same width, steps and seed; each member its own lr and hparams, its own run): at most this many per "
        "batch; 1: each trial alone; 'auto': as many as a GPU's memory holds, 1 on CPU (studies.members)")
    runner: Literal["ray", "local"] = Field(
        "ray", description="'ray': the phases' trials on Ray Tune (Optuna TPE + ASHA); 'local': in this process, no "
        "Ray (workers.runner.InProcessRunner: TPE asked and told here, batched on a GPU, one trial or batch at a "
        "time, no early stopping, resumable from its journal; MLflow optional)")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="the MLflow target")

    @field_validator("storage")
    @classmethod
    def _storage(cls, value: str | None) -> str | None:
        if value is None or (value.startswith("s3://") and len(value.rstrip("/")) > 5) or value.startswith("/"):
            return value
        raise ValueError(f"resources.storage={value!r}: give an absolute path that every Ray node mounts, or an "
                         "S3 URI such as s3://bucket/prefix")

    @model_validator(mode="after")
    def _whole_gpus(self) -> ResourcesSpec:
        for name in ("gpus_per_trial", "transfer_gpus"):
            value = getattr(self, name)
            if value is not None and value > 1 and value != int(value):
                raise ValueError(f"resources.{name}={value}: fractions are allowed below 1 only; "
                                 "use a whole number of GPUs")
        return self


class SpecProblems(ValueError):  # a ValueError: pydantic reports it as the spec's value error
    """A spec's cross-field problems: one message ("; "-joined) and each problem kept, so that a caller can show
    each at the field it names (`service.field_errors`)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems

    def __reduce__(self) -> tuple[type[SpecProblems], tuple[list[str]]]:
        return SpecProblems, (self.problems,)  # pickled (Ray) with its list, not the joined text


class StudySpec(BaseModel):
    """One study: what to train, how to search, where to transfer, how to judge."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    later: ClassVar[Later] = (("compare",),)  # transfer studies keep the hash they had before it

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_-]+$",
                      description="slug: lowercase letters, digits, '-', '_' (1–64 chars)")
    description: str = Field("", description="free text, echoed in the report")
    model: ModelSpec = Field(default_factory=ModelSpec, description="family, parametrization, architecture")
    data: DataSpec = Field(default_factory=DataSpec, description="the MLM data")
    train: TrainSpec = Field(default_factory=TrainSpec, description="the training budget of one trial")
    space: FamilySpace = Field(  # None: the family's
        None, validate_default=True, description="the search space: PT's 7 hparams, BERT's/UT's 4, TauGPT's 4")
    tune: TuneSpec = Field(description="the tune phase (compare: the study's model at its proxy width)")
    transfer: TransferSpec | None = Field(None, description="the transfer phase; null: a tune-only study")
    verify: VerifySpec | None = Field(default_factory=VerifySpec, description="verify phase, at verify.width or else "
                                      "the largest of transfer.widths (one is needed); null skips it")
    validate_: ValidateSpec | None = Field(
        None, alias="validate", description="the optional lr-drift phase (attribute `validate_`)")
    compare: CompareSpec | None = Field(
        None, description="a compare study (families at equal parameter budgets) instead of transfer/verify")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="per-trial resources")

    @field_validator("space", mode="wrap")
    @classmethod
    def _space_of_family(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        if "model" not in info.data:  # the model section failed: its error is the one to report
            return value
        return validate_space(value, info.data["model"].family, **nested(info))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        """One variant per family, with its arch and space (`studies.schema`)."""
        json_schema: dict[str, Any] = handler(schema)
        by_family(json_schema, handler, ModelSpec.model_fields["family"].default, study=True)
        return json_schema

    @model_validator(mode="before")
    @classmethod
    def _compare_skips_verify(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("compare") is not None and "verify" not in data:
            data = {**data, "verify": None}  # a compare study has no verify phase unless one is asked for
        return data

    @model_validator(mode="before")
    @classmethod
    def _objective_of_family(cls, data: Any) -> Any:
        """An omitted `data.objective` is the family's (TauGPT: clm); a given one is checked after validation."""
        if not isinstance(data, dict):
            return data
        model, section = data.get("model"), data.get("data")
        family = model.get("family", "pt") if isinstance(model, dict) else getattr(model, "family", "pt")
        if "data" not in data or (isinstance(section, dict) and "objective" not in section):
            data = {**data, "data": {**(section or {}), "objective": _objective(family)}}
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> StudySpec:
        base, arch, problems = self.tune.base_width, self.model.arch, self._family_problems()
        sections = [name for name, section in (("transfer", self.transfer), ("verify", self.verify),
                                               ("validate", self.validate_)) if section is not None]
        if self.compare is not None:
            problems += self.compare.problems(self.model, self.data.vocab_size, base, sections)
            if self.tune.steps is not None:
                problems.append("tune.steps is unused in a compare study (tune trials see compare.tune_tokens): "
                                "remove it or set compare.tune_tokens")
            if self.train.warmup_steps >= self.steps_for("tune"):
                problems.append(f"train.warmup_steps={self.train.warmup_steps} must be < the compare tune trials' "
                                f"{self.steps_for('tune')} steps: lower warmup_steps or raise compare.tune_tokens")
        elif self.verify is not None and self.verify.width is None and self.transfer is None:
            problems.append("verify needs a width: set verify.width, add transfer.widths, or set verify: null")
        transfer_widths = self.transfer.widths if self.transfer is not None else []
        widths = [(f"transfer.widths[{i}]", w) for i, w in enumerate(transfer_widths)]
        problems += [e for e in [width_error(arch, base, base, "tune.base_width")] if e]
        problems += [f"{where}={w} must be > tune.base_width={base} (transfer goes wider): drop it or lower "
                     "tune.base_width" for where, w in widths if w <= base]
        if self.verify is not None and self.verify.width is not None:
            widths.append(("verify.width", self.verify.width))
            if self.verify.width < base:
                problems.append(f"verify.width={self.verify.width} must be >= tune.base_width={base}")
        if self.validate_ is not None:
            widths += [(f"validate.widths[{i}]", w) for i, w in enumerate(self.validate_.widths)]
            if error := mup_error(arch, "mup"):
                problems.append(f"validate runs mup, which this model cannot ({error}): drop validate or change "
                                "model.arch")
            problems += [p for sweep in self.validate_.present() for p in sweep.problems(self)]
        problems += [e for where, w in widths if (e := width_error(arch, base, w, where))]
        if self.tune.asha.enabled and self.tune.asha.grace_steps > self.steps_for("tune"):
            problems.append(f"tune.asha.grace_steps={self.tune.asha.grace_steps} exceeds the tune trials' "
                            f"{self.steps_for('tune')} steps: lower it, raise tune.steps (compare: "
                            "compare.tune_tokens) or disable asha")
        if self.compare is not None and self.tune.batch_size is not None:
            problems.append("tune.batch_size is unused in a compare study (its tune trials train at "
                            "train.batch_size): remove it")
        for phase in ["compare"] if self.compare is not None else ["tune", *sections]:  # the phases it runs
            if self.train.warmup_steps >= self.steps_for(phase):
                problems.append(f"train.warmup_steps={self.train.warmup_steps} must be < the {phase} phase's "
                                f"{self.steps_for(phase)} steps: lower warmup_steps or raise the steps")
        if problems:
            raise SpecProblems(problems)
        return self

    def _family_problems(self) -> list[str]:
        """Per-family checks: position rows for every token, the family's data objective."""
        models = [("model", self.model)]
        models += [(f"compare.baselines[{i}].model", b.model) for i, b in enumerate(self.compare.baselines)] \
            if self.compare is not None else []
        problems = [e for where, m in models if (e := context_error(m.arch, self.data.seq_len, where))]
        if self.train.weight_decay_form != "coupled" and get_family(self.model.family).mup is not None:
            problems.append(f"train.weight_decay_form={self.train.weight_decay_form!r}: model.family "
                            f"{self.model.family!r} trains with mup's MuAdamW, which already decays every group by "
                            "lr × λ per step (the independent form): leave weight_decay_form out")
        if self.train.optimizer == "muon" and get_family(self.model.family).mup is not None:
            problems.append(f"train.optimizer='muon': model.family {self.model.family!r} trains with mup's own "
                            "optimiser (MuAdamW or MuSGD), which Muon cannot replace: leave train.optimizer out")
        objective = get_family(self.model.family).objective
        if self.data.objective != objective:
            problems.append(f"data.objective={self.data.objective!r} does not fit model.family "
                            f"{self.model.family!r}, which trains with {objective!r}: set data.objective: "
                            f"{objective} (or leave it out)")
        return problems

    # ----------------------------------------------------------------------------- io
    @classmethod
    def from_yaml(cls, source: str | Path) -> StudySpec:
        """A spec from YAML text, or from a file (a `Path`, or a one-line str ending .yaml/.yml)."""
        if isinstance(source, Path) or ("\n" not in source and source.strip().endswith((".yaml", ".yml"))):
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"no spec file {path}; give a YAML file or YAML text "
                                        f"(catalog: {sorted(p.name for p in CATALOG_DIR.glob('*.yaml'))})")
            source = path.read_text(encoding="utf-8")
        return cls.model_validate(yaml.safe_load(source))

    def as_dict(self) -> dict[str, Any]:
        """The spec as plain JSON-able data under its YAML keys (`validate`, not `validate_`), without the later
        fields left at their defaults (`LaterFields`, and `later` here)."""
        data: dict[str, Any] = without_later_defaults(self, self.model_dump(mode="json", by_alias=True))
        return data

    def to_yaml(self) -> str:
        """The spec as YAML, every default written out; `from_yaml(s.to_yaml()) == s`."""
        text: str = yaml.safe_dump(self.as_dict(), sort_keys=False, allow_unicode=True)  # PyYAML ships no types
        return text

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of `as_dict()` (sorted keys, defaults filled in but the later fields'
        left out, `LaterFields`: the one rule that keeps every earlier spec's hash): equal specs hash equal.

        `resources.max_retries`, `checkpoint_every_s`, `storage`, `batch_members` and `runner` are left out: they
        change how a study copes with faults, where it keeps its checkpoints and how and where its trials are packed
        into processes, not what each trial computes, so a study keeps its id when they do.
        """
        data = self.as_dict()
        for key in ("max_retries", "checkpoint_every_s", "storage", "batch_members", "runner"):
            data["resources"].pop(key, None)
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    # ----------------------------------------------------------------------------- helpers
    def steps_for(self, phase: str) -> int:
        """The optimizer steps of one trial in `phase`: its section's override (tune.steps, verify.steps, the
        validate horizon), else train.steps; a compare study's tune and compare trials from its token budgets."""
        c = self.compare
        if c is not None and phase in ("tune", "compare"):
            tokens = (c.tune_tokens if phase == "tune" else None) or c.tokens
            return c.steps(tokens, self.train.batch_size, self.data.seq_len)
        own = {"tune": self.tune.steps, "verify": self.verify.steps if self.verify else None,
               "validate": self.validate_horizon()}
        return own.get(phase) or self.train.steps

    def asha_rungs(self) -> list[float]:
        """The steps ASHA may judge a tune trial at: grace·η^k up to the budget (Ray's rungs are among them); none
        for the local runner, which stops no trial early (ASHA is Ray Tune's scheduler)."""
        asha, max_t = self.tune.asha, self.steps_for("tune")
        rungs: list[float] = []
        rung: float = asha.grace_steps
        while asha.enabled and self.resources.runner == "ray" and rung <= max_t:
            rungs.append(rung)
            rung *= asha.reduction_factor
        return rungs

    def search_space(self) -> dict[str, tuple[float, float, bool]]:
        """The searched hparams as (low, high, log): the Optuna distributions of both runners."""
        return {name: (r.low, r.high, r.log) for name, r in self.space.searched().items()}

    def batch_for(self, phase: str) -> int:
        """The sequences per step of one trial in `phase`: tune.batch_size for tune (when set), else
        train.batch_size (a batch sweep's trials: their own, `PlannedTrial.batch_size`)."""
        return (self.tune.batch_size if phase == "tune" else None) or self.train.batch_size

    def base_batch(self) -> int:
        """The batch the hparams are tuned at: tune.batch_size, else train.batch_size (the batch sweep's B_base)."""
        return self.batch_for("tune")

    def validate_horizon(self) -> int:
        """The validate sweep's main training length: `validate.steps` (else train.steps); with a list of them,
        train.steps when listed, else the longest. The width drift, the regret and the other hparams' sweeps
        train this long; lr also at each other listed length."""
        v = self.validate_
        horizons = v.horizons() if v is not None else []
        if horizons:
            return self.train.steps if self.train.steps in horizons else horizons[-1]
        return (v.steps if v is not None and isinstance(v.steps, int) else None) or self.train.steps

    def verify_width(self) -> int:
        """The verify width: `verify.width`, else the largest transfer width."""
        if self.verify is not None and self.verify.width is not None:
            return self.verify.width
        if self.transfer is None:
            raise ValueError("this study has no verify width: set verify.width or add transfer.widths")
        return max(self.transfer.widths)

    def experiment_name(self) -> str:
        """The MLflow experiment: `resources.tracking.experiment`, else the study name."""
        return self.resources.tracking.experiment or self.name

    def model_hp(self, width: int, hparams: dict[str, float], parametrization: str | None = None,
                 depth: int | None = None, depth_parametrization: DepthParametrization | None = None
                 ) -> dict[str, Any]:
        """The model config's kwargs (all but vocab_size) at `width`: arch, width, base_width, parametrization
        and the hparams but `lr` (PT: the six information weights; BERT/UT: init_std, output_mult, attn_mult;
        missing hparams take the space's defaults). `depth` (a depth sweep's trial): the arch at that depth under
        `depth_parametrization` (`DepthArch.at_depth`)."""
        error = width_error(self.model.arch, self.tune.base_width, width, "width")
        if error:
            raise ValueError(error)
        param = parametrization or self.model.parametrization
        if param not in get_args(Parametrization):
            raise ValueError(f"parametrization {param!r}: choose one of {list(get_args(Parametrization))}")
        arch = self.model.arch
        if depth is not None:
            if not isinstance(arch, DepthArch):
                raise ValueError(f"depth={depth}: model.family {self.model.family!r} has no depth parametrization")
            arch = arch.at_depth(depth, depth_parametrization or arch.depth_parametrization)
        hp = self.space.complete(hparams)
        return {**arch.model_dump(), "width": width, "base_width": self.tune.base_width,
                "parametrization": param, **{h: hp[h] for h in self.space.HPARAMS if h != "lr"}}

    def trial_config(self, width: int, hparams: dict[str, float], seed: int, steps: int | None = None,
                     parametrization: str | None = None, depth: int | None = None,
                     depth_parametrization: DepthParametrization | None = None,
                     batch_size: int | None = None) -> dict[str, Any]:
        """The plain dict `TrialConfig.model_validate` takes: `lr` at the top level, the
        information weights in `model_hp`, `data` as a dict, the training budget with `steps`
        (default train.steps; pass `steps_for(phase)`) and `seed`; `depth`: a depth sweep's (`model_hp`);
        `batch_size`: default train.batch_size (pass `batch_for(phase)`, or a batch sweep's)."""
        if steps is not None and steps < 1:
            raise ValueError(f"steps={steps} must be >= 1 (or None for train.steps={self.train.steps})")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1 (or None for train.batch_size="
                             f"{self.train.batch_size})")
        hp = self.space.complete(hparams)
        train = self.train.model_dump(mode="json")
        train["steps"] = steps or self.train.steps
        if WEIGHT_DECAY in hp:  # a searched or swept λ overrides the fixed train.weight_decay
            train[WEIGHT_DECAY] = hp[WEIGHT_DECAY]
        train["batch_size"] = batch_size or self.train.batch_size
        return {"model": self.model.family,
                "model_hp": self.model_hp(width, hp, parametrization, depth, depth_parametrization),
                "data": self.data.model_dump(mode="json"), "lr": hp["lr"], **train, "seed": seed}

