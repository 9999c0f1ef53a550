"""The vectorised PT forward against a slow, literal transcription of the spec's MFVI equations.

`reference_logits` is written from spec §2.1–2.2, §2.5 and §3.5 with plain Python loops over
(sequence, channel, i, j, a, b) on Python floats (float64). It shares nothing with
`workers.models.pt` except the parameter values: the ternary scores T^(c)_k[a, b] are rebuilt
entry by entry from U, V (, W) or read from the full T tensor, and the messages are the spec's

    F_ic(j) = Σ_{a,b} Q_i(a) Q_j(b) T^(c)_{k(i,j)}[a, b]
    G_i(a)  = Σ_c Σ_{j≠i} Σ_b [ Q_ic(j) Q_j(b) T^(c)_{k(i,j)}[a, b] + Q_jc(i) Q_j(b) T^(c)_{k(j,i)}[b, a] ]

with the bucket k(dependent, head) = f(dependent − head) of §2.1, λ_H = 1/d and λ_Z = 1. The
information weights enter where spec §3.2 puts them (w_H on F, w_unary on S, w_dep / w_head on the
two halves of G, w_topic on the topic logits, w_topic_z on the topic → Z message). Padding
positions are not variables: they are neither heads nor dependents, and only real positions are
compared.

The model runs in float64 and eval mode with dropout 0, so the tolerance 1e-5 is about algebra,
not rounding. Parameters are redrawn larger than the default init so that every softmax is far
from uniform and a wrong bucket, scale or transpose changes the logits by much more than 1e-5
(`test_reference_detects_mutations` checks that).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import float64_default
from workers.models import build_model

VOCAB, WIDTH, CHANNELS, RANK, N_ITER, BATCH, LENGTH = 20, 6, 2, 3, 3, 2, 7
TOL = 1e-5


# --------------------------------------------------------------------------------------------
# literal reference
# --------------------------------------------------------------------------------------------
def bucket(x: int, gamma: int) -> int:
    """f(x) of spec §2.1 for x = dependent − head ≠ 0; γ = 0 gives two buckets, one per direction."""
    assert x != 0
    if x < -gamma:
        return 0
    if x < 0:
        return x + gamma + 1
    if x <= gamma:
        return x + gamma
    return 2 * gamma + 1


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    es = [math.exp(x - top) for x in xs]
    tot = sum(es)
    return [e / tot for e in es]


def ternary_scores(model) -> list:
    """T[k][c][a][b] as nested Python lists, rebuilt entry by entry from the model's parameters."""
    cfg = model.cfg
    K, h, d, r = cfg.n_buckets, cfg.h, cfg.width, cfg.r
    if cfg.decomposition == "none":
        return model.T.detach().double().tolist()  # (K, h, d, d)
    U, V = model.U.detach().double().tolist(), model.V.detach().double().tolist()
    W = model.W.detach().double().tolist() if cfg.decomposition == "uvw" else None
    T = [[[[0.0] * d for _ in range(d)] for _ in range(h)] for _ in range(K)]
    for k in range(K):
        for c in range(h):
            for a in range(d):
                for b in range(d):
                    for l in range(r):
                        if W is None:  # uv: T^(c)[k] = U[k,c] V[k,c]ᵀ
                            T[k][c][a][b] += U[k][c][a][l] * V[k][c][b][l]
                        else:  # uvw: Σ_l U[k,a,l] V[k,b,l] W[k,c,l]
                            T[k][c][a][b] += U[k][a][l] * V[k][b][l] * W[k][c][l]
    return T


def coefficients(cfg) -> dict[str, float]:
    """Scalars of the MFVI update for `cfg` (standard: spec §2.2/§2.5; μP: spec §3.4–3.5)."""
    d, r, m = cfg.width, cfg.r, cfg.m
    if cfg.parametrization == "standard":
        return {
            "z": 1.0,  # Q_j enters messages as a probability
            "h": cfg.w_H * d,  # 1/λ_H with λ_H = 1/d
            "topic": cfg.w_topic * d,  # topic logits scaled like H (d / regularize_H, §2.5)
            "topic_out": 1.0,
        }
    tau = d / r if cfg.tau_form == "d_over_r" else (d / r) / (cfg.base_width / cfg.rank)
    return {
        "z": float(d),  # P̃ = d·P
        "h": cfg.w_H * tau / d,  # = w_H / r for τ = d/r
        "topic": cfg.w_topic * (m / d if cfg.topic_coef == "m_over_d" else 1.0),  # on P̃
        "topic_out": float(m),  # P̃_g = m·P_g
    }


def reference_logits(model, ids: torch.Tensor, mask: torch.Tensor, **mutate) -> list[list[list[float] | None]]:
    """MLM logits [b][i][v] by literal MFVI; None at padding positions.

    `mutate` deliberately breaks one rule (used only to show the comparison has teeth):
    flip_bucket (use f(head − dependent)), head_no_transpose (T[a,b] instead of T[b,a] in the
    head-side message), lambda_h_one (λ_H = 1), z_unscaled (μP messages from P instead of P̃ = d·P).
    """
    cfg = model.cfg
    d, h, gamma = cfg.width, cfg.h, cfg.gamma
    coef = coefficients(cfg)
    if mutate.get("lambda_h_one"):
        coef["h"] = cfg.w_H
    if mutate.get("z_unscaled"):
        coef["z"] = 1.0
    T = ternary_scores(model)
    S = model.unary.weight.detach().double().tolist()
    Wd = model.decoder.weight.detach().double().tolist()
    bd = model.decoder.bias.detach().double().tolist()
    Bt = model.B.detach().double().tolist() if cfg.topic == "single_split" else None

    def kb(dep: int, head: int) -> int:
        return bucket(head - dep if mutate.get("flip_bucket") else dep - head, gamma)

    def t_head(k: int, c: int, a: int, b: int) -> float:  # T^(c)_k[b, a] (i is the head)
        return T[k][c][a][b] if mutate.get("head_no_transpose") else T[k][c][b][a]

    out: list[list[list[float] | None]] = []
    for s in range(ids.shape[0]):
        words = ids[s].tolist()
        real = [i for i in range(ids.shape[1]) if bool(mask[s, i])]
        L_z = {i: list(S[words[i]]) for i in real}  # Q^(0)_i ∝ exp(S[w_i])
        # H logits L_h[c][i][j] for real i ≠ j; all 0 = a uniform H over the other real words
        L_h = [{i: {j: 0.0 for j in real if j != i} for i in real} for _ in range(h)]
        Q_prev = Q_h_prev = None  # the last marginals (step size)
        for t in range(cfg.n_iter):
            Q_raw = {i: softmax(L_z[i]) for i in real}
            if t:  # step size: P^t = α·softmax + (1−α)·P^{t−1}
                Q_raw = {i: [mix(cfg.stepsize_Z, p, o) for p, o in zip(Q_raw[i], Q_prev[i], strict=True)]
                         for i in real}
            Q_prev = Q_raw
            Q = {i: [coef["z"] * p for p in Q_raw[i]] for i in real}
            if not cfg.async_update:  # synchronous: this iteration's H is the last iteration's logits
                Q_h_sync = [h_marginals(L_h[c], Q_h_prev[c] if t else None, cfg.stepsize_H) for c in range(h)]
            # H update: F_ic(j) = Σ_ab Q_i(a) Q_j(b) T^(c)_{k(i,j)}[a, b]
            L_h_new = []
            for c in range(h):
                rows = {}
                for i in real:
                    rows[i] = {}
                    for j in real:
                        if j == i:
                            continue
                        Tk = T[kb(i, j)][c]
                        F_icj = sum(Q[i][a] * Q[j][b] * Tk[a][b] for a in range(d) for b in range(d))
                        rows[i][j] = mix(1 - cfg.damping_H, coef["h"] * F_icj, L_h[c][i][j])  # damping
                L_h_new.append(rows)
            if cfg.async_update:  # H from the current Z, then Z from the new H
                Q_msg = [h_marginals(L_h_new[c], Q_h_prev[c] if t else None, cfg.stepsize_H) for c in range(h)]
            else:
                Q_msg = Q_h_sync
            Q_h_prev, L_h = Q_msg, L_h_new
            # Z update: unary + G_dep + G_head (+ topic)
            new = {}
            for i in real:
                if cfg.topic == "single_split":
                    # ℋ_i(g) = Σ_a Q_i(a) B[g, a];  Q'_i = softmax;  Z message Σ_g Q'_i(g) B[g, a]
                    m = len(Bt)
                    topic = [coef["topic"] * sum(Q[i][a] * Bt[g][a] for a in range(d)) for g in range(m)]
                    Q_g = [coef["topic_out"] * p for p in softmax(topic)]
                row = []
                for a in range(d):
                    g_dep = g_head = 0.0
                    for c in range(h):
                        for j in real:
                            if j == i:
                                continue
                            Tij = T[kb(i, j)][c]  # i dependent, j head
                            g_dep += sum(Q_msg[c][i][j] * Q[j][b] * Tij[a][b] for b in range(d))
                            k_ji = kb(j, i)  # j dependent, i head
                            g_head += sum(Q_msg[c][j][i] * Q[j][b] * t_head(k_ji, c, a, b) for b in range(d))
                    z = cfg.w_unary * S[words[i]][a] + cfg.w_dep * g_dep
                    if not cfg.block_msg:
                        z += cfg.w_head * g_head
                    if cfg.topic == "single_split":
                        z += cfg.w_topic_z * sum(Q_g[g] * Bt[g][a] for g in range(m))
                    row.append(mix(1 - cfg.damping_Z, z, L_z[i][a]))  # damping: β·old + (1−β)·new
                new[i] = row
            L_z = new
        seq: list[list[float] | None] = []
        for i in range(ids.shape[1]):
            if i not in L_z:
                seq.append(None)
                continue
            seq.append([bd[v] + sum(L_z[i][a] * Wd[v][a] for a in range(d)) for v in range(len(Wd))])
        out.append(seq)
    return out


def mix(alpha: float, new: float, old: float) -> float:
    return alpha * new + (1 - alpha) * old


def h_marginals(logits: dict, prev: dict | None, stepsize: float) -> dict:
    """Q_ic(·) = softmax over the heads j of logits[i][j], mixed with the last marginals by the step size."""
    out = {}
    for i, row in logits.items():
        heads = list(row)
        probs = dict(zip(heads, softmax([row[j] for j in heads]), strict=True))
        out[i] = probs if prev is None else {j: mix(stepsize, probs[j], prev[i][j]) for j in heads}
    return out


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def make_model(seed: int = 0, **hp):
    """A float64 PT in eval mode at the small test size, parameters redrawn at informative scales."""
    base = {
        "vocab_size": VOCAB,
        "width": WIDTH,
        "base_width": WIDTH,
        "n_channels": CHANNELS,
        "rank": RANK,
        "n_iter": N_ITER,
        "n_topics": 4,
        "dropout": 0.0,
    }
    torch.manual_seed(seed)
    model = build_model("pt", **{**base, **hp}).double().eval()
    mup = model.cfg.parametrization == "mup"
    g = torch.Generator().manual_seed(seed + 1)
    scales = {  # μP feeds P̃ = d·P into the messages, so its factors are drawn smaller
        "unary.weight": 1.0,
        "U": 0.4 if mup else 0.8,
        "V": 0.4 if mup else 0.8,
        "W": 0.8,
        "T": 0.6,
        "B": 0.3 if mup else 0.8,
        "decoder.weight": 0.5,
        "decoder.bias": 0.5,
    }
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scales[name])
    return model


def make_batch(seed: int = 0, pad: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    if pad:
        mask[1, LENGTH - pad :] = False  # second sequence shorter
    return ids, mask


def max_abs_diff(model_out: torch.Tensor, ref: list, mask: torch.Tensor) -> float:
    worst = 0.0
    for s in range(mask.shape[0]):
        for i in range(mask.shape[1]):
            if bool(mask[s, i]):
                got = model_out[s, i]
                want = torch.tensor(ref[s][i], dtype=torch.float64)
                worst = max(worst, (got - want).abs().max().item())
            else:
                assert ref[s][i] is None
    return worst


def check(hp: dict, seed: int = 0, pad: int = 2) -> None:
    model = make_model(seed, **hp)
    ids, mask = make_batch(seed, pad)
    with torch.no_grad(), float64_default():
        got = model(ids, mask)
    assert got.dtype == torch.float64 and torch.isfinite(got).all()
    ref = reference_logits(model, ids, mask)
    scale = max(abs(x) for seq in ref for row in seq if row is not None for x in row)
    assert scale > 0.5, "degenerate test: logits too small to discriminate"
    err = max_abs_diff(got, ref, mask)
    assert err < TOL, f"{hp}: max |model − reference| = {err:.3g} (logit scale {scale:.3g})"


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------
STANDARD_CASES = {
    "async_gamma2_uv": {"gamma": 2},
    "async_gamma0_two_buckets": {"gamma": 0},
    "async_gamma1": {"gamma": 1},
    "sync_gamma2": {"gamma": 2, "async_update": False},
    "sync_gamma0": {"gamma": 0, "async_update": False},
    "uvw_gamma2": {"gamma": 2, "decomposition": "uvw"},
    "uvw_gamma1_sync": {"gamma": 1, "decomposition": "uvw", "async_update": False},
    "none_gamma2": {"gamma": 2, "decomposition": "none"},
    "none_gamma0": {"gamma": 0, "decomposition": "none"},
    "block_msg": {"gamma": 2, "block_msg": True},
    "block_msg_sync_uvw": {"gamma": 1, "block_msg": True, "async_update": False, "decomposition": "uvw"},
    "topic_single_split": {"gamma": 2, "topic": "single_split"},
    "topic_gamma0_none": {"gamma": 0, "topic": "single_split", "decomposition": "none"},
    "info_weights": {
        "gamma": 2,
        "topic": "single_split",
        "w_H": 0.7,
        "w_dep": 1.3,
        "w_head": 0.6,
        "w_unary": 1.8,
        "w_topic": 2.1,
        "w_topic_z": 0.4,
    },
    "stepsize_damping": {"gamma": 2, "stepsize_Z": 0.6, "stepsize_H": 0.7, "damping_Z": 0.3, "damping_H": 0.4},
    "stepsize_damping_sync": {
        "gamma": 1, "async_update": False, "stepsize_Z": 0.5, "stepsize_H": 0.8, "damping_Z": 0.5, "damping_H": 0.25,
    },
    "damping_uvw_topic": {"gamma": 0, "decomposition": "uvw", "topic": "single_split", "damping_Z": 0.5},
    "stepsize_none_block": {"gamma": 2, "decomposition": "none", "block_msg": True, "stepsize_Z": 0.4},
    "info_weights_sync_uvw": {
        "gamma": 1,
        "async_update": False,
        "decomposition": "uvw",
        "w_H": 1.9,
        "w_dep": 0.5,
        "w_head": 1.4,
        "w_unary": 0.8,
    },
}


@pytest.mark.parametrize("hp", list(STANDARD_CASES.values()), ids=list(STANDARD_CASES))
def test_standard_forward_matches_literal_mfvi(hp):
    check(hp)


def test_no_padding_and_longer_padding():
    check({"gamma": 2}, seed=3, pad=0)
    check({"gamma": 1, "decomposition": "uvw"}, seed=4, pad=4)  # 3 real words: all pairs near


# μP (spec §3.5): P̃ = d·P, H logits w_H·(τ/d)·q·k (= w_H/r for τ = d/r), messages not divided.
# width 6 at base_width 3 so that d ≠ d0 and h is scaled (channels) or r is scaled (rank).
MUP = {"parametrization": "mup", "width": 6, "base_width": 3, "n_channels": 1, "rank": 3, "n_topics": 2}
MUP_CASES = {
    "mup_channels": {**MUP, "gamma": 2},
    "mup_rank": {**MUP, "paradigm": "rank", "n_channels": 2, "rank": 2, "gamma": 1},
    "mup_gamma0_sync": {**MUP, "gamma": 0, "async_update": False},
    "mup_block_msg": {**MUP, "gamma": 2, "block_msg": True},
    "mup_info_weights": {**MUP, "gamma": 2, "w_H": 1.7, "w_dep": 0.6, "w_head": 1.2, "w_unary": 0.9},
    "mup_tau_base_normalized": {**MUP, "paradigm": "rank", "n_channels": 2, "tau_form": "base_normalized"},
    "mup_stepsize_damping": {
        **MUP, "gamma": 1, "stepsize_Z": 0.7, "stepsize_H": 0.5, "damping_Z": 0.2, "damping_H": 0.6,
    },
}


@pytest.mark.parametrize("hp", list(MUP_CASES.values()), ids=list(MUP_CASES))
def test_mup_forward_matches_literal_mfvi(hp):
    check(hp)


@pytest.mark.parametrize("coef", ["m_over_d", "one"])
def test_mup_topic_matches_literal_mfvi(coef):
    check({**MUP, "gamma": 2, "topic": "single_split", "topic_coef": coef, "w_topic": 1.3, "w_topic_z": 0.8})


@pytest.mark.parametrize(
    ("mutation", "hp"),
    [
        ("flip_bucket", {"gamma": 2}),
        ("flip_bucket", {"gamma": 0}),  # two buckets at γ = 0: the direction matters
        ("head_no_transpose", {"gamma": 2}),
        ("lambda_h_one", {"gamma": 2}),
        ("z_unscaled", MUP_CASES["mup_channels"]),
    ],
    ids=["flip-bucket", "flip-bucket-gamma0", "head-no-transpose", "lambda-h-one", "mup-z-unscaled"],
)
def test_reference_detects_mutations(mutation, hp):
    """The comparison has teeth: each one-rule change of the reference moves the logits ≫ TOL."""
    model = make_model(0, **hp)
    ids, mask = make_batch(0)
    with torch.no_grad():
        got = model(ids, mask)
    assert max_abs_diff(got, reference_logits(model, ids, mask), mask) < TOL
    assert max_abs_diff(got, reference_logits(model, ids, mask, **{mutation: True}), mask) > 1e-2


def test_bucket_function():
    # spec §2.1 with γ = 3: offsets 1, 2, 3 and ≥ 4 on each side, K = 8
    assert [bucket(x, 3) for x in (-9, -4, -3, -2, -1, 1, 2, 3, 4, 9)] == [0, 0, 1, 2, 3, 4, 5, 6, 7, 7]
    # γ = 0 is the authors' dists = "": one bucket per direction, K = 2
    assert [bucket(x, 0) for x in (-5, -1, 1, 5)] == [0, 0, 1, 1]


def test_sync_keeps_dtype():
    model = make_model(0, gamma=1, async_update=False)
    ids, mask = make_batch(0)
    with torch.no_grad():
        assert model(ids, mask).dtype == torch.float64
