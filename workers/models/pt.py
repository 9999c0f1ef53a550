"""Probabilistic Transformer (Wu & Tu 2023) and its μP-scaled version (Kuang, Wu & Tu 2026).

PT is a CRF over latent word labels Z (d labels each) and head selections H (h channels); its forward pass is T
iterations of mean-field variational inference (MFVI) in tensor form (spec §2.3), parameters shared across them.
μP changes (spec §3.3–3.5) sit in blocks marked `# --- μP ---`, each a row of docs/mup.md's rule → code table
and guarded by the coordinate-check test. The config, `PTConfig`, is declared in `studies.arch`.

Memory (`PTConfig.recompute`, default on): per iteration only q = P·U and k = P·V are kept for backward; the
hand-written backward (`_Scores`, `_Messages`) recomputes the rest from A, q, k, with the arithmetic of
`recompute=False` (tests/workers/test_pt_recompute.py).
Shapes: B batch, n length, d width (Z labels), h channels, r rank, K = 2γ+2 distance buckets, m topics.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from studies.families.pt import PTConfig
from workers.models.common import parameter
from workers.models.contract import LanguageModel

NEG = -1e9  # logit for impossible head choices (self, padding)


class _Offsets:
    """Index structures for the distance buckets at one length n, built once per n.

    Bucket of a (dependent i, head j) pair is f(i - j) from spec §2.1: i - j < -γ is bucket 0
    (`far_neg`), -γ ≤ i - j < 0 is i-j+γ+1, 0 < i - j ≤ γ is i-j+γ, i - j > γ is 2γ+1 (`far_pos`).
    With γ = 0 the two far buckets are the two directions (the authors' `dists = ""`). Near pairs
    touch only 2γ diagonals, so they are listed as
    (k, i, j) triples; the two far buckets are full n×n products masked to their triangles.
    """

    def __init__(self, n: int, gamma: int, device: torch.device) -> None:
        i = torch.arange(n, device=device)
        diff = i[:, None] - i[None, :]  # (n, n): i - j
        self.far_neg = diff < -gamma  # bucket 0 (head after the dependent when γ = 0)
        self.far_pos = diff > gamma  # bucket 2γ+1 (head before the dependent when γ = 0)
        ks, di, hj = [], [], []
        for off in range(1, gamma + 1):  # runs once per length, not per forward
            if off >= n:
                break
            rows = torch.arange(off, n, device=device)
            ks += [torch.full_like(rows, gamma + off), torch.full_like(rows, gamma + 1 - off)]
            di += [rows, rows - off]  # i - j = off | i - j = -off
            hj += [rows - off, rows]
        empty = torch.zeros(0, dtype=torch.long, device=device)
        self.k = torch.cat(ks) if ks else empty  # (P,) bucket of each near pair
        self.i = torch.cat(di) if di else empty  # (P,) dependent
        self.j = torch.cat(hj) if hj else empty  # (P,) head
        self.n, self.gamma = n, gamma
        # the far masks as 0/1 factors (a boolean mask in a product is converted on every call); built here, not
        # cached on first use, which torch.compile cannot trace inside the autograd Functions below
        self._far_weights = (self.far_neg.float(), self.far_pos.float())
        # the same near pairs as whole diagonals: (s = i - j, bucket) for 0 < |s| ≤ γ, |s| < n
        self.near = [(s, s + gamma + 1 if s < 0 else s + gamma) for s in range(-gamma, gamma + 1) if 0 < abs(s) < n]

    def far_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`far_neg`, `far_pos` as 0/1 tensors of `dtype` (float32's are kept; another dtype's, an (n, n) cast)."""
        neg, pos = self._far_weights
        return neg.to(dtype), pos.to(dtype)


def head_scores_indexed(q: torch.Tensor, k: torch.Tensor, o: _Offsets) -> torch.Tensor:
    """F[b,c,i,j] = Σ_k M[k,i,j] <q_k[i], k_k[j]>.  q, k: (B, n, K, h, r) → (B, h, n, n)."""
    far = q[:, :, 0].transpose(1, 2) @ k[:, :, 0].permute(0, 2, 3, 1)  # (B, h, n, n)
    F_ = torch.where(o.far_neg, far, 0.0)
    far = q[:, :, -1].transpose(1, 2) @ k[:, :, -1].permute(0, 2, 3, 1)
    F_ = F_ + torch.where(o.far_pos, far, 0.0)
    if o.k.numel():
        vals = (q[:, o.i, o.k] * k[:, o.j, o.k]).sum(-1)  # (B, P, h) near-diagonal scores
        Bsz, h, n, _ = F_.shape
        F_ = F_.reshape(Bsz, h, n * n).index_add(-1, o.i * n + o.j, vals.transpose(1, 2)).view(Bsz, h, n, n)
    return F_

def gather_indexed(A: torch.Tensor, x: torch.Tensor, o: _Offsets, transpose: bool) -> torch.Tensor:
    """ctx[b,i,k,c] = Σ_j A[c,i,j]·M[k,i,j]·x_k[j]   (transpose: Σ_j A[c,j,i]·M[k,j,i]·x_k[j]).

    A: (B, h, n, n); x: (B, n, K, h, r) → (B, n, K, h, r), laid out for one GEMM back to d.
    """
    At = A.transpose(-1, -2) if transpose else A
    ctx = torch.zeros_like(x)
    far = torch.where(o.far_neg.T if transpose else o.far_neg, At, 0.0) @ x[:, :, 0].transpose(1, 2)
    ctx[:, :, 0] = far.transpose(1, 2)  # (B, h, n, r) → (B, n, h, r)
    far = torch.where(o.far_pos.T if transpose else o.far_pos, At, 0.0) @ x[:, :, -1].transpose(1, 2)
    ctx[:, :, -1] = far.transpose(1, 2)
    if o.k.numel():
        # near pairs (k, i dependent, j head): the receiver is i (dep) or j (head)
        recv, send = (o.j, o.i) if transpose else (o.i, o.j)
        a = A[:, :, o.i, o.j]  # (B, h, P)
        vals = a.transpose(1, 2)[..., None] * x[:, send, o.k]  # (B, P, h, r)
        Bsz, n, K, h, r = x.shape
        ctx = ctx.view(Bsz, n * K, h, r).index_add(1, recv * K + o.k, vals).view(Bsz, n, K, h, r)
    return ctx



# the diagonal kernels (recompute=True): the indexed kernels' sums, each near bucket one diagonal of the (n, n)
# scores and one shifted slice of x, the far buckets products with 0/1 masks (half triu/tril's time on CPU). The
# (B, h, n, n) passes are most of a CPU step's memory traffic, so each is made once (`far_parts`), in place with
# ops vmap batches (`mul_`, `+=`; `addcmul_` has no batching rule and would loop over the members).
def _near_slices(s: int, n: int) -> tuple[slice, slice]:
    """Dependents i and heads j = i − s of the pairs at signed offset s, as slices of 0..n−1."""
    i0, i1 = max(s, 0), n + min(s, 0)
    return slice(i0, i1), slice(i0 - s, i1 - s)


def head_scores(q: torch.Tensor, k: torch.Tensor, o: _Offsets) -> torch.Tensor:
    """F[b,c,i,j] = Σ_k M[k,i,j] <q_k[i], k_k[j]>.  q, k: (B, n, K, h, r) → (B, h, n, n)."""
    neg, pos = o.far_weights(q.dtype)
    F_ = (q[:, :, 0].transpose(1, 2) @ k[:, :, 0].permute(0, 2, 3, 1)).mul_(neg)  # j > i + γ
    F_ += (q[:, :, -1].transpose(1, 2) @ k[:, :, -1].permute(0, 2, 3, 1)).mul_(pos)  # j < i − γ
    for s, kb in o.near:  # F[i, i − s], one diagonal per near bucket
        dep, head = _near_slices(s, o.n)
        F_.diagonal(-s, -2, -1).copy_((q[:, dep, kb] * k[:, head, kb]).sum(-1).transpose(1, 2))
    return F_


def far_parts(A: torch.Tensor, o: _Offsets) -> tuple[torch.Tensor, torch.Tensor]:
    """A's two far buckets, A·M_far_neg and A·M_far_pos, each (B, h, n, n): `gather`'s far operands."""
    neg, pos = o.far_weights(A.dtype)
    return A * neg, A * pos


def gather(A: torch.Tensor, x: torch.Tensor, o: _Offsets, transpose: bool,
           far: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """ctx[b,i,k,c] = Σ_j A[c,i,j]·M[k,i,j]·x_k[j]   (transpose: Σ_j A[c,j,i]·M[k,j,i]·x_k[j]).

    A: (B, h, n, n); x: (B, n, K, h, r) → (B, n, K, h, r); no index ops, no autograd. `far`: `far_parts(A, o)`,
    made once by the caller for every gather from A.
    """
    n = o.n
    ctx = torch.empty_like(x)
    far_neg, far_pos = far
    if transpose:
        far_neg, far_pos = far_neg.transpose(-1, -2), far_pos.transpose(-1, -2)
    ctx[:, :, 0] = (far_neg @ x[:, :, 0].transpose(1, 2)).transpose(1, 2)  # (B, h, n, r) → (B, n, h, r)
    ctx[:, :, -1] = (far_pos @ x[:, :, -1].transpose(1, 2)).transpose(1, 2)
    ctx[:, :, 1:-1] = 0.0  # one fill for the rows no near pair reaches (fewer ops than per-bucket fills)
    for s, kb in o.near:
        dep, head = _near_slices(s, n)
        recv, send = (head, dep) if transpose else (dep, head)
        a = A.diagonal(-s, -2, -1).transpose(1, 2)[..., None]  # (B, n − |s|, h, 1): A[c, i, i − s]
        ctx[:, recv, kb] = a * x[:, send, kb]
    return ctx


def _damped(beta: float, prev: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """MFVI damping β·prev + (1−β)·new; at β = 0 (the default) `new` itself, the same values without the passes."""
    return beta * prev + (1 - beta) * new if beta else new


class _Scores(torch.autograd.Function):
    """F = head_scores(q, k) with a hand-written backward: dq = gather(dF, k), dk = gatherᵀ(dF, q).

    Both directions are the same two bucketed kernels (F_ij = Σ_k M_kij <q_k[i], k_k[j]> is bilinear),
    so nothing beyond q and k is kept, and each gradient is written into one buffer.
    """

    generate_vmap_rule = True  # batched trials (`workers.batched`) vmap it: forward and backward batch as written

    @staticmethod
    def forward(q: torch.Tensor, k: torch.Tensor, o: _Offsets) -> torch.Tensor:
        return head_scores(q, k.to(q.dtype), o)  # under autocast both are the projection GEMMs' dtype already

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        q, k, o = inputs
        ctx.save_for_backward(q, k.to(q.dtype))
        ctx.o = o

    @staticmethod
    def backward(ctx: Any, dF: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        q, k = ctx.saved_tensors
        dF = dF.to(q.dtype)  # backward runs outside autocast: one dtype, as in forward
        far = far_parts(dF, ctx.o)
        return gather(dF, k, ctx.o, False, far), gather(dF, q, ctx.o, True, far), None


class _Messages(torch.autograd.Function):
    """(G_dep, G_head) = (gather(A, k)·Uᵀ, gatherᵀ(A, q)·Vᵀ), keeping only A, q, k, U, V for backward.

    The contexts (B, n, K·h·r) autograd would keep for dU = G_depᵀ·ctx are rebuilt in backward
    (the gather: far n×n products and near index ops, a small fraction of the d ↔ K·h·r GEMMs).
    With a context gradient c = g·U: dA = head_scores(c, k) (+ head_scores(q, c_head)),
    dk = gatherᵀ(A, c), dq = gather(A, c_head). `head` False: G_dep only (block_msg).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(A: torch.Tensor, q: torch.Tensor, k: torch.Tensor, Wu: torch.Tensor, Wv: torch.Tensor, o: _Offsets,
                head: bool) -> tuple[torch.Tensor, torch.Tensor]:
        Bsz, n = q.shape[:2]
        # one compute dtype, q's: under autocast the bf16 projections, else the model's (autograd casts
        # each gradient back to its input's dtype, e.g. float32 for A and the weights)
        A, k, Wu, Wv = (t.to(q.dtype) for t in (A, k, Wu, Wv))
        far = far_parts(A, o)
        dep = gather(A, k, o, False, far).view(Bsz, n, -1) @ Wu.T
        return dep, (gather(A, q, o, True, far).view(Bsz, n, -1) @ Wv.T if head else torch.zeros_like(dep))

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        A, q, k, Wu, Wv, o, head = inputs
        ctx.save_for_backward(*(t.to(q.dtype) for t in (A,)), q, *(t.to(q.dtype) for t in (k, Wu, Wv)))
        ctx.o, ctx.head = o, head

    @staticmethod
    def backward(ctx: Any, g_dep: torch.Tensor, g_head: torch.Tensor) -> tuple[
            torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None, None, None]:
        A, q, k, Wu, Wv = ctx.saved_tensors
        o, shape = ctx.o, q.shape
        g_dep, g_head = g_dep.to(q.dtype), g_head.to(q.dtype)
        rows = shape[0] * shape[1]
        far = far_parts(A, o)
        c = (g_dep @ Wu).view(shape)  # d loss / d ctx_dep
        dWu = g_dep.reshape(rows, -1).T @ gather(A, k, o, False, far).view(rows, -1)
        dq: torch.Tensor | None
        dWv: torch.Tensor | None
        dA, dk, dq, dWv = head_scores(c, k, o), gather(A, c, o, True, far), None, None
        if ctx.head:
            c = (g_head @ Wv).view(shape)
            dWv = g_head.reshape(rows, -1).T @ gather(A, q, o, True, far).view(rows, -1)
            dA += head_scores(q, c, o)
            dq = gather(A, c, o, False, far)
        return dA, dq, dk, dWu, dWv, None, None


class ProbabilisticTransformer(LanguageModel):
    """PT encoder + MLM head. `forward(input_ids, attention_mask)` returns (B, n, |V|) logits.

    With `select` (a (B, n) mask, e.g. `labels != -100`) only the selected positions are decoded.
    """

    def __init__(self, cfg: PTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, r, K, V = cfg.width, cfg.h, cfg.r, cfg.n_buckets, cfg.vocab_size
        mup = cfg.parametrization == "mup"
        self.unary = nn.Embedding(V, d)  # S (|V|, d): unary scores
        if cfg.decomposition == "uv":
            self.U = nn.Parameter(torch.empty(K, h, d, r))  # per bucket and channel
            self.V = nn.Parameter(torch.empty(K, h, d, r))
        elif cfg.decomposition == "uvw":
            self.U = nn.Parameter(torch.empty(K, d, r))
            self.V = nn.Parameter(torch.empty(K, d, r))
            self.W = nn.Parameter(torch.empty(K, h, r))
        else:
            self.T = nn.Parameter(torch.empty(K, h, d, d))  # full ternary scores T^(c)[k]_{ab}
        if cfg.topic == "single_split":
            self.B = nn.Parameter(torch.empty(cfg.m, d))  # binary factor (m, d)
        self.decoder = nn.Linear(d, V)  # MLM head, not tied to S (PT paper)
        self.drop_h = nn.Dropout(cfg.dropout)  # H (and topic) dropout
        self.drop_z = nn.Dropout(cfg.dropout)  # Z-logit dropout
        self._offsets: _Offsets | None = None
        self.t_l2 = 0.0  # the ‖T‖ penalty's weight (`before_trial`: the trial's train.t_l2)

        # parameter groups (spec §3.3): input / hidden / output / bias
        self.groups = {"input": [parameter(self.unary.weight)], "output": [parameter(self.decoder.weight)],
                       "bias": [parameter(self.decoder.bias)]}
        self.groups["hidden"] = [p for name, p in self.named_parameters() if name in ("U", "V", "W", "T", "B")]

        with torch.no_grad():
            if mup:
                # --- μP: init (spec §3.3) ---
                nn.init.normal_(self.unary.weight, std=cfg.init_std_input)  # width-independent
                for p in self.groups["hidden"]:
                    nn.init.normal_(p, std=cfg.init_std_hidden / math.sqrt(d))  # variance ∝ 1/d
                out_scale = 1 / cfg.width_mult if cfg.output_init == "inv_d" else 1 / math.sqrt(cfg.width_mult)
                nn.init.normal_(self.decoder.weight, std=cfg.init_std_output / math.sqrt(cfg.base_width) * out_scale)
                nn.init.zeros_(self.decoder.bias)
                # --- end μP ---
            else:  # the authors' inits (spec §2.6); decoder keeps nn.Linear's default
                nn.init.xavier_uniform_(self.unary.weight)
                for name in ("U", "V", "W"):
                    if hasattr(self, name):
                        nn.init.normal_(getattr(self, name), std=1 / math.sqrt(r))
                if hasattr(self, "T"):
                    nn.init.normal_(self.T, std=1.0)
                if hasattr(self, "B"):
                    nn.init.normal_(self.B, std=1 / math.sqrt(d))

    # ---------------------------------------------------------------------------------------
    def lr_multipliers(self) -> dict[str, float]:
        """Per-group learning-rate multipliers for AdamW (spec §3.3)."""
        if self.cfg.parametrization != "mup":
            return {"input": 1.0, "hidden": 1.0, "output": 1.0, "bias": 1.0}
        # --- μP: Adam learning rates, hidden and output ∝ 1/width_mult ---
        k = self.cfg.width_mult
        return {"input": 1.0, "hidden": 1.0 / k, "output": 1.0 / k, "bias": 1.0}
        # --- end μP ---

    def width_groups(self) -> tuple[str, ...]:
        """The groups whose lr μP divides by width_mult (`lr_multipliers`): hidden and output."""
        return ("hidden", "output")

    def matrices(self) -> dict[str, int]:
        """Muon's matrices (`LanguageModel.matrices`): U, V and T, each a stack over buckets and channels of (d, r)
        (T: (d, d)) factors applied as x @ U (fan-in d, dim -2), and the topic factor B, (m, d) as nn.Linear's
        (fan-in d, dim -1). W, a per-channel diagonal, is a vector: AdamW."""
        return {name: -2 if name in ("U", "V", "T") else -1 for name in ("U", "V", "T", "B") if hasattr(self, name)}

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Effective per-bucket, per-channel factors (U, V), each (K, h, d, r'), with T^(c)[k] = U Vᵀ.

        uvw: U_kc = U_k · diag(W_kc); none: U_kc = T^(c)[k], V_kc = I (r' = d).
        """
        if self.cfg.decomposition == "uv":
            return self.U, self.V
        if self.cfg.decomposition == "uvw":
            return self.U[:, None] * self.W[:, :, None, :], self.V[:, None].expand(-1, self.cfg.h, -1, -1)
        eye = torch.eye(self.cfg.width, device=self.T.device, dtype=self.T.dtype)
        return self.T, eye.expand(self.cfg.n_buckets, self.cfg.h, -1, -1)

    def before_trial(self, config: Any) -> None:
        self.t_l2 = config.t_l2

    def aux_loss(self) -> torch.Tensor | None:
        """The authors' L2 penalty t_l2 · ‖T‖ (None when t_l2 is 0)."""
        return self.t_l2 * self.t_norm() if self.t_l2 > 0 else None

    def t_norm(self) -> torch.Tensor:
        """Unsquared Frobenius norm of the full (K, d, d, h) ternary tensor (the authors' L2 penalty).

        ‖U Vᵀ‖² = tr((UᵀU)(VᵀV)), so the d×d tensor is never built.
        """
        U, V = self.factors()
        if self.cfg.decomposition == "none":
            norm: torch.Tensor = self.T.norm()
            return norm
        sq = torch.einsum("khdr,khds,khes,kher->", U, U, V, V)
        return sq.clamp_min(0).sqrt()

    def _offsets_for(self, n: int, device: torch.device) -> _Offsets:
        if self._offsets is None or self._offsets.n != n or self._offsets.k.device != device:
            self._offsets = _Offsets(n, self.cfg.gamma, device)
        return self._offsets

    # ---------------------------------------------------------------------------------------
    def _head_scores(self, q: torch.Tensor, k: torch.Tensor, o: _Offsets) -> torch.Tensor:
        scores: torch.Tensor = (_Scores.apply(q, k, o)  # type: ignore[no-untyped-call]  # torch: untyped apply
                                if self.cfg.recompute else head_scores_indexed(q, k, o))
        return scores

    def _messages(self, A: torch.Tensor, q: torch.Tensor, k: torch.Tensor, Wu: torch.Tensor, Wv: torch.Tensor,
                  o: _Offsets) -> tuple[torch.Tensor, torch.Tensor | None]:
        """G_dep = gather(A, k)·Uᵀ and G_head = gatherᵀ(A, q)·Vᵀ (None with block_msg), each (B, n, d)."""
        head = not self.cfg.block_msg
        if self.cfg.recompute:
            messages: tuple[torch.Tensor, torch.Tensor] = _Messages.apply(  # type: ignore[no-untyped-call]
                A, q, k, Wu, Wv, o, head)  # torch: Function.apply is untyped
            dep, msg_head = messages
            return dep, (msg_head if head else None)
        Bsz, n = q.shape[:2]
        dep = gather_indexed(A, k, o, False).view(Bsz, n, -1) @ Wu.T
        return dep, (gather_indexed(A, q, o, True).view(Bsz, n, -1) @ Wv.T if head else None)

    def _mix_h(self, A: torch.Tensor, A_prev: torch.Tensor | None, t: int) -> torch.Tensor:
        """The authors' H step size: A^t = α·A + (1−α)·A^{t−1} after the first iteration."""
        alpha = self.cfg.stepsize_H
        if not t or alpha == 1.0:
            return A
        assert A_prev is not None  # set by the first iteration
        return alpha * A + (1 - alpha) * A_prev

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, n)
        attention_mask: torch.Tensor | None = None,  # (B, n) bool, True at real tokens
        trace: dict[str, torch.Tensor] | None = None,  # filled with intermediates when given
        select: torch.Tensor | None = None,  # (B, n) bool: score only these positions (MLM targets)
    ) -> torch.Tensor:
        cfg = self.cfg
        mup = cfg.parametrization == "mup"
        Bsz, n = input_ids.shape
        d, r, m = cfg.width, cfg.r, cfg.m
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        if not cfg.recompute and torch.is_autocast_enabled(input_ids.device.type):
            raise ValueError("PTConfig.recompute=False does not support autocast (its index kernels need one dtype); "
                             "set recompute: true")
        pad = ~attention_mask  # (B, n)
        o = self._offsets_for(n, input_ids.device)
        U, V = self.factors()  # (K, h, d, r)
        # all buckets and channels side by side: one GEMM each way per iteration
        Wu = U.permute(2, 0, 1, 3).reshape(d, -1)  # (d, K·h·r)
        Wv = V.permute(2, 0, 1, 3).reshape(d, -1)
        qk_shape = (Bsz, n, *U.shape[:2], U.shape[-1])  # (B, n, K, h, r)

        X = self.unary(input_ids).masked_fill(pad[..., None], 0.0)  # (B, n, d)
        invalid = torch.eye(n, dtype=torch.bool, device=X.device) | pad[:, None, :, None] | pad[:, None, None, :]
        if mup:
            # --- μP: coefficients of the messages (spec §3.4–3.5, eq. 7) ---
            z_scale = float(d)  # P̃ = d·P, Θ(1) coordinates
            tau = d / r if cfg.tau_form == "d_over_r" else (d / r) / (cfg.base_width / cfg.rank)
            h_scale = tau / d  # = 1/r: attention logits scale as 1/r, not 1/√r
            g_scale = m / d if cfg.topic_coef == "m_over_d" else 1.0  # topic logits on P̃ (P below is P̃)
            topic_out = float(m)  # P̃_g = m·P_g
            # --- end μP ---
        else:
            z_scale, h_scale, g_scale, topic_out = 1.0, float(d), float(d), 1.0  # λ_H = 1/d, λ_Z = 1

        L_z = X
        P_prev = A_prev = None  # last marginals, for the step size
        L_h = torch.zeros(Bsz, cfg.h, n, n, device=X.device, dtype=X.dtype)  # H logits: uniform H at first
        for t in range(cfg.n_iter):
            P = torch.softmax(L_z, -1)
            if t and cfg.stepsize_Z != 1.0:
                assert P_prev is not None  # set by the first iteration
                P = cfg.stepsize_Z * P + (1 - cfg.stepsize_Z) * P_prev
            P_prev = P
            P = P.masked_fill(pad[..., None], 0.0) * z_scale  # (B, n, d)
            q = (P @ Wu).view(qk_shape)  # (B, n, K, h, r)
            k = (P @ Wv).view(qk_shape)
            F_h = (cfg.w_H * h_scale) * self._head_scores(q, k, o)  # (B, h, n, n) the new H message
            if cfg.async_update:  # H from the current Z, then Z from the new H; dropout on the probabilities
                L_h = _damped(cfg.damping_H, L_h, F_h).masked_fill(invalid, NEG)
                A = self._mix_h(torch.softmax(L_h, -1), A_prev, t)
                A = A_prev = self.drop_h(A)
                shown = L_h
            else:  # both from the previous iteration; the authors drop the H *logits* here
                A = A_prev = self._mix_h(torch.softmax(L_h.masked_fill(invalid, NEG), -1), A_prev, t)
                shown = _damped(cfg.damping_H, L_h, F_h).masked_fill(invalid, NEG)
                L_h = self.drop_h(shown)  # masked again when used, so a dropped NEG never opens a head
            msg_dep, msg_head = self._messages(A, q, k, Wu, Wv, o)  # G_dep, G_head (B, n, d)
            msg = cfg.w_unary * X + cfg.w_dep * msg_dep
            if msg_head is not None:
                msg = msg + cfg.w_head * msg_head
            if cfg.topic == "single_split":
                L_g = (cfg.w_topic * g_scale) * (P @ self.B.T)  # (B, n, m) topic logits
                P_g = self.drop_h(torch.softmax(L_g, -1)) * topic_out
                msg_topic = P_g @ self.B  # (B, n, d)
                msg = msg + cfg.w_topic_z * msg_topic
            L_z = self.drop_z(_damped(cfg.damping_Z, L_z, msg))  # λ_Z = 1; unnormalised (softmax at the next iteration)
            if trace is not None:
                valid = ~invalid.expand_as(shown)
                trace[f"head_logits.iter{t}"] = shown[valid]
                trace[f"msg_dep.iter{t}"] = msg_dep
                if msg_head is not None:  # None exactly with block_msg
                    trace[f"msg_head.iter{t}"] = msg_head
                if cfg.topic == "single_split":
                    trace[f"topic_logits.iter{t}"] = L_g
                    trace[f"msg_topic.iter{t}"] = msg_topic
                trace[f"z_logits.iter{t}"] = L_z
        logits: torch.Tensor = self.decoder(L_z if select is None else L_z[select])  # (B, n, |V|) or (N_selected, |V|)
        if trace is not None:
            trace["mlm_logits"] = logits
        return logits
