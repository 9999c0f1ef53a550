"""Feature-space graph Laplacians for Tauformer's taumode attention (Tauformer spec §2).

L is D×D over the coordinates of a head vector (D = head_dim), unnormalised (L = Deg − W), symmetric
and positive semi-definite, with the constant vector in its null space. Three sources:

- `chain_laplacian(D)`: the 1-D path graph, the reference code's default (spec §2.2).
- `knn_laplacian(embeddings, D)`: the feature-kNN recipe arrowspace uses for its "domain manifold"
  (spec §2.3), on an item-embedding matrix reduced to D features by PCA (spec §2.5).
- `load_laplacian(path, D)`: a D×D matrix saved with `numpy.save` (checked to be a Laplacian).

`rotated(L, seed)` is the spectrum-only control of spec §2.6: UᵀLU for a seeded random orthogonal U.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from workers.errors import ConfigError, InputNotFound

# arrowspace's builder settings for the published manifold (spec §2.2): candidates per feature, the
# largest kept cosine distance, and the weight w = 1 / (1 + (d/σ)^p).
KNN_TOPK, KNN_EPS, KNN_SIGMA, KNN_P, KNN_CLUSTERS = 15, 1.31, 0.535, 1.8, 179


def chain_laplacian(dim: int) -> torch.Tensor:
    """(D, D) path-graph Laplacian: degrees 1, 2, …, 2, 1 on the diagonal, −1 beside it."""
    if dim < 2:
        raise ConfigError(f"chain_laplacian needs dim >= 2, got {dim}")
    weights = torch.zeros(dim, dim, dtype=torch.float64)
    idx = torch.arange(dim - 1)
    weights[idx, idx + 1] = weights[idx + 1, idx] = 1.0
    return from_weights(weights)


def from_weights(weights: torch.Tensor) -> torch.Tensor:
    """L = Deg − W for a symmetric non-negative adjacency W (zero diagonal), as float32."""
    weights = weights.clone()
    weights.fill_diagonal_(0.0)
    return (torch.diag(weights.sum(1)) - weights).float()


def _kmeans(x: np.ndarray, k: int, seed: int, iters: int = 20) -> np.ndarray:
    """Lloyd's k-means on the rows of x, initialised at k distinct random rows (seeded).

    Distances go through ‖x‖² − 2x·c + ‖c‖², an (N, k) matrix: no (N, k, F) intermediate.
    """
    rng = np.random.default_rng(seed)
    centres = x[rng.choice(len(x), size=k, replace=False)].copy()
    norms = (x ** 2).sum(1, keepdims=True)
    for _ in range(iters):
        nearest = (norms - 2 * x @ centres.T + (centres ** 2).sum(1)).argmin(1)
        counts = np.bincount(nearest, minlength=k)
        sums = np.zeros_like(centres)
        np.add.at(sums, nearest, x)
        filled = counts > 0
        centres[filled] = sums[filled] / counts[filled, None]
    return centres


def knn_laplacian(embeddings: np.ndarray, dim: int, *, n_clusters: int = KNN_CLUSTERS, topk: int = KNN_TOPK,
                  eps: float = KNN_EPS, sigma: float = KNN_SIGMA, p: float = KNN_P, seed: int = 0) -> torch.Tensor:
    """The (dim, dim) domain Laplacian of an (N, F) item-embedding matrix by the feature-kNN recipe.

    1. PCA to `dim` features (when F > dim); cluster the N items into at most `n_clusters` centroids.
    2. Transpose: each feature is a node described by its values across the centroids.
    3. Each feature keeps, among its `topk` most cosine-similar other features, those at rectified cosine
       distance d = 1 − max(0, cos) ≤ eps, with weight w = 1 / (1 + (d/σ)^p).
    4. If the mean degree exceeds 10, each feature keeps its top half by w·√(deg_i·deg_j).
    5. Symmetrise by the larger of w_ij and w_ji (an edge kept by either end), then L = Deg − W.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ConfigError(f"embeddings must be an (N, F) matrix with N >= 2, got shape {x.shape}")
    if x.shape[1] < dim:
        raise ConfigError(f"embeddings have {x.shape[1]} features, fewer than the Laplacian size {dim}: "
                          "use embeddings at least head_dim wide")
    x = x - x.mean(0)
    if x.shape[1] > dim:  # PCA to dim features
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        x = x @ vt[:dim].T
    centroids = _kmeans(x, min(n_clusters, len(x)), seed)  # (X, dim)
    nodes = centroids.T  # (dim, X): one row per feature
    unit = nodes / np.maximum(np.linalg.norm(nodes, axis=1, keepdims=True), 1e-12)
    cos = unit @ unit.T
    np.fill_diagonal(cos, -np.inf)
    k = min(topk, dim - 1)
    candidates = np.argsort(-cos, axis=1)[:, :k]  # (dim, k)
    dist = 1.0 - np.maximum(0.0, np.take_along_axis(cos, candidates, 1))
    w = np.where(dist <= eps, 1.0 / (1.0 + (dist / sigma) ** p), 0.0)  # (dim, k)
    deg = (w > 0).sum(1)
    if deg.mean() > 10:
        score = w * np.sqrt(deg[:, None] * deg[candidates])
        cut = np.sort(score, axis=1)[:, ::-1][:, max(1, k // 2) - 1:max(1, k // 2)]
        w = np.where(score >= cut, w, 0.0)
    weights = np.zeros((dim, dim))
    np.put_along_axis(weights, candidates, w, axis=1)
    return from_weights(torch.from_numpy(np.maximum(weights, weights.T)))


def check_laplacian(lap: torch.Tensor, dim: int, where: str) -> torch.Tensor:
    """`lap` as float32 if it is a (dim, dim) symmetric matrix with zero row sums and no negative eigenvalue."""
    if tuple(lap.shape) != (dim, dim):
        raise ConfigError(f"{where}: the Laplacian is {tuple(lap.shape)}, but head_dim={dim} needs ({dim}, {dim})")
    lap = lap.double()
    scale = float(lap.abs().max()) or 1.0
    if not torch.allclose(lap, lap.T, atol=1e-6 * scale):
        raise ConfigError(f"{where}: the Laplacian is not symmetric: symmetrise it, e.g. (L + L.T) / 2")
    if float(lap.sum(1).abs().max()) > 1e-5 * scale:
        raise ConfigError(f"{where}: the rows do not sum to 0; an unnormalised Laplacian is Deg − W")
    if float(torch.linalg.eigvalsh(lap)[0]) < -1e-6 * scale:
        raise ConfigError(f"{where}: the Laplacian has a negative eigenvalue; it must be positive semi-definite")
    return lap.float()


def load_laplacian(path: str, dim: int) -> torch.Tensor:
    """A (dim, dim) Laplacian saved with `numpy.save`."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputNotFound(f"laplacian_path={path!r}: no such file; save a ({dim}, {dim}) matrix with numpy.save")
    return check_laplacian(torch.from_numpy(np.load(file)), dim, f"laplacian_path={path!r}")


def rotated(lap: torch.Tensor, seed: int) -> torch.Tensor:
    """UᵀLU for a seeded random orthogonal U: the same spectrum in another basis (spec §2.6's control)."""
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(lap.shape, generator=gen, dtype=torch.float64))
    u = q * torch.sign(torch.diagonal(r))  # Haar-distributed
    out: torch.Tensor = (u.T @ lap.double() @ u).float()
    return out


def describe(lap: torch.Tensor) -> dict[str, float]:
    """What spec §2.4 reports of a Laplacian: edges, degrees, the spectrum, trace/D, connected components."""
    lap = lap.double()
    off = lap - torch.diag(lap.diagonal())
    neighbours = (off < 0).sum(1)
    eig = torch.linalg.eigvalsh(lap)
    return {"dim": lap.shape[0], "edges": int((off < 0).sum()) // 2,
            "neighbours_min": int(neighbours.min()), "neighbours_median": float(neighbours.double().median()),
            "neighbours_max": int(neighbours.max()), "degree_min": float(lap.diagonal().min()),
            "degree_max": float(lap.diagonal().max()), "eig_min": float(eig[0]), "eig_max": float(eig[-1]),
            "trace_over_dim": float(lap.trace()) / lap.shape[0],
            "components": int((eig.abs() < 1e-8 * max(1.0, float(eig[-1]))).sum())}
