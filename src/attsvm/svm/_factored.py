"""The reduced, factored nuclear-norm problem shared by the augmented Lagrangian and the polish.

``_Reduced`` is the solvers' view of an instance already reduced and normalised by
:func:`~attsvm.svm.reduction.reduce` (unit features, O(1) right-hand sides), flattened over k;
:class:`NuclearOptions` carries every tuning constant of the nuclear solvers (docs/spec.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._validation import check_choice, check_finite_scalar, check_positive_int
from .reduction import Reduction

__all__ = ["NuclearOptions", "balanced_factors"]


@dataclass(frozen=True)
class NuclearOptions:
    """Options of :func:`solve_nuclear` and :func:`solve_nuclear_rank` (module doc for the method).

    tol, max_iter, seed : relative duality gap to stop at, outer ALM iterations, symmetry-breaking seed.
    path : "auto" (our lean L-BFGS up to ``small_k`` rows, handing over to scipy's L-BFGS-B after
        ``lean_max_failed_polish`` polishes that did not certify), "lean" or "scipy" (one path only).
    p0 : smallest initial number of factor columns. rho_max : largest ALM penalty before a stall.
    inner_max : L-BFGS iterations per subproblem; lbfgs_memory, lbfgs_max_halvings : L-BFGS settings.
    gtol0, gtol0_small : gradient tolerance of the first subproblem (small: at most small_k rows).
    polish_gap : ALM relative gap below which the Newton polish is first tried (then at each tenfold drop).
    rank_rtol_fast, rank_rtol_safe : relative singular-value thresholds of the polish's rank guess.
    dual_rank_tol : on the large (scipy) path the first, fast guess also caps the rank at
        #{σ_i(𝒜*λ) > 1 − dual_rank_tol}.
    newton_patience : Newton iterations over which the KKT residual must halve.
    chord_rate, chord_min_rows : a chord Jacobian is refreshed after a step reducing the residual by
        less than chord_rate, and always on systems of at most chord_min_rows rows.
    direct_kkt_max : KKT systems up to this many unknowns are factorised whole.
    early_exit_res, early_exit_lam, early_viol_factor : a Newton round stops early once its residual is
        below early_exit_res while an inequality multiplier is below −early_exit_lam·max|λ|; rows
        violated by more than early_viol_factor × the residual are then added.
    release_frac : a polish round releases the inequality rows whose multiplier is at most release_frac ×
        the most negative one (0: every row with λ < 0). Releasing all of them at once can drop rows that
        the optimum keeps (their multipliers turn positive once the more negative rows are gone), after
        which Newton finds no KKT point round after round.
    """

    tol: float = 1e-9
    max_iter: int = 60
    seed: int = 0
    path: str = "auto"
    p0: int = 8
    rho_max: float = 1e10
    inner_max: int = 5000
    lbfgs_memory: int = 20
    lbfgs_max_halvings: int = 40
    gtol0: float = 1e-3
    gtol0_small: float = 1e-2
    small_k: int = 400
    lean_max_failed_polish: int = 2
    polish_gap: float = 1e-1
    rank_rtol_fast: float = 1e-3
    rank_rtol_safe: float = 1e-6
    dual_rank_tol: float = 3e-3
    newton_patience: int = 5
    chord_rate: float = 0.2
    chord_min_rows: int = 200
    direct_kkt_max: int = 160
    early_exit_res: float = 1e-3
    early_exit_lam: float = 1e-6
    early_viol_factor: float = 100.0
    release_frac: float = 0.1

    def __post_init__(self) -> None:
        check_finite_scalar(self.tol, "tol", positive=True)
        check_positive_int(self.max_iter, "max_iter")
        check_positive_int(self.seed, "seed", minimum=0)
        check_choice(self.path, "path", ("auto", "lean", "scipy"))
        check_positive_int(self.p0, "p0")
        check_positive_int(self.inner_max, "inner_max")
        check_positive_int(self.newton_patience, "newton_patience")
        check_finite_scalar(self.release_frac, "release_frac")
        if not 0.0 <= self.release_frac < 1.0:
            raise ValueError(f"release_frac must be in [0, 1), got {self.release_frac!r}")


def _options(options: NuclearOptions | None, overrides: dict[str, Any], fn: str) -> NuclearOptions:
    opt = NuclearOptions() if options is None else options
    if not isinstance(opt, NuclearOptions):
        raise TypeError(f"options must be a NuclearOptions, got {type(opt).__name__}")
    if overrides:
        unknown = sorted(set(overrides) - {f.name for f in fields(NuclearOptions)})
        if unknown:
            raise TypeError(f"{fn} got unknown option(s) {unknown}; see NuclearOptions")
        opt = replace(opt, **overrides)
    return opt


# ----------------------------------------------------------------------------- reduced operator
@dataclass
class _Reduced:
    """Row-normalised constraints on the reduced variable M (r_a, r_z), flattened over k."""

    A: NDArray[np.float64]  # (n, T, r_a) features / scale (0 where not a constraint)
    Z: NDArray[np.float64]  # (n, r_z)
    b: NDArray[np.float64]  # (n, T) rhs / scale
    ineq: NDArray[np.bool_]  # (n, T)
    eq: NDArray[np.bool_]  # (n, T)
    mask: NDArray[np.bool_]  # (n, T) active constraints (non-zero features)
    scale: NDArray[np.float64]  # (n, T) ‖a_it‖ ‖z_i‖ (1 where masked out)

    # 𝒜, 𝒜* as in :class:`~attsvm.svm._base.Operator`, but summed by einsum rather than batched
    # BLAS: the augmented Lagrangian's early polish succeeds or not (one outer iteration or two)
    # depending on round-off-level differences of its path, and the benchmarks were measured on
    # this summation order.
    def apply(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.einsum("ntr,nr->nt", self.A, self.Z @ M.T)

    def apply_factored(self, K: NDArray[np.float64], Q: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.einsum("ntr,nr->nt", self.A, (self.Z @ Q) @ K.T)

    def adjoint(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.einsum("nt,ntr->nr", lam, self.A).T @ self.Z

    def violation(self, m: NDArray[np.float64]) -> float:
        """Max violation in the *original* (unscaled) units."""
        r = (self.b - m) * self.scale
        v_in = np.where(self.ineq, np.maximum(r, 0.0), 0.0).max(initial=0.0)
        v_eq = np.where(self.eq, np.abs(r), 0.0).max(initial=0.0)
        return float(max(v_in, v_eq))


def _reduce(reduction: Reduction) -> _Reduced:
    """The ALM's view of a reduced, normalised instance (:func:`~attsvm.svm.reduction.reduce`):
    the rows flattened to unit features (their norms are 1 up to round-off; dividing makes them 1)."""
    cs = reduction.problem
    scale = np.sqrt((cs.A**2).sum(-1)) * np.sqrt((cs.Z**2).sum(-1))[:, None]  # (n, T)
    mask = cs.mask & (scale > 0)
    s = np.where(mask, scale, 1.0)
    return _Reduced(
        A=np.where(mask[..., None], cs.A / s[..., None], 0.0),
        Z=cs.Z,
        b=np.where(mask, cs.rhs / s, 0.0),
        ineq=mask & ~cs.equality,
        eq=mask & cs.equality,
        mask=mask,
        scale=s,
    )


def distinct_rows(red: _Reduced) -> NDArray[np.int64]:
    """The flat indices of the constraint rows, each repeated row once (a duplicated token gives two
    identical rows: the same feature, query, right-hand side and kind — within a sequence, or across
    sequences that share a query). A repeated row adds nothing to the program but makes the interior
    point's Schur complement singular; its multiplier is 0 in the solution (any split of one multiplier
    over identical rows is a solution)."""
    idx = np.flatnonzero(red.mask.ravel())
    n, T, r_a = red.A.shape
    if idx.size < 2 or r_a == 0:
        return idx
    A, Z = red.A.reshape(n * T, r_a)[idx], red.Z[idx // T]
    rows = np.column_stack([Z, A, red.b.ravel()[idx], red.eq.ravel()[idx]])
    # (usually no row repeats: sorting the rows and comparing neighbours says so without np.unique's copies)
    srt = rows[np.lexsort(rows.T[::-1])]
    if not (srt[1:] == srt[:-1]).all(axis=1).any():
        return idx
    _, first = np.unique(rows, axis=0, return_index=True)
    return idx[np.sort(first)]


def without_repeats(red: _Reduced) -> _Reduced:
    """``red`` with every repeated row (:func:`distinct_rows`) but its first set aside like a vanished one
    (mask off, zero feature and right-hand side, scale 1): the same feasible set, and the solvers' systems stay
    nonsingular; the set-aside rows get multiplier 0. ``red`` itself when no row repeats."""
    flat = np.zeros(red.mask.size, dtype=bool)
    flat[distinct_rows(red)] = True
    keep = flat.reshape(red.mask.shape)
    if np.array_equal(keep, red.mask):
        return red
    return replace(
        red,
        A=np.where(keep[..., None], red.A, 0.0),
        b=np.where(keep, red.b, 0.0),
        scale=np.where(keep, red.scale, 1.0),
        ineq=red.ineq & keep,
        eq=red.eq & keep,
        mask=keep,
    )


# ----------------------------------------------------------------------------- helpers
def balanced_factors(
    W: NDArray[np.float64], rank: int | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``K = U √Σ``, ``Q = V √Σ`` from the SVD of W (optionally truncated to ``rank`` columns).

    They attain the variational identity ``½(‖K‖_F² + ‖Q‖_F²) = ‖W‖_*`` (docs/spec.md §3).
    """
    U, s, Vt = np.linalg.svd(np.asarray(W, dtype=np.float64), full_matrices=False)
    if rank is not None:
        U, s, Vt = U[:, :rank], s[:rank], Vt[:rank]
    r = np.sqrt(s)
    return U * r, Vt.T * r


def _nuclear(M: NDArray[np.float64]) -> float:
    return float(np.linalg.svd(M, compute_uv=False).sum()) if M.size else 0.0


def _spectral(M: NDArray[np.float64]) -> float:
    return float(np.linalg.svd(M, compute_uv=False)[0]) if M.size else 0.0


def _make_feasible(red: _Reduced, M: NDArray[np.float64]) -> NDArray[np.float64]:
    """Exactly feasible primal near M: least-norm correction on equality rows, then rescaling."""
    if red.eq.any():
        idx = np.flatnonzero(red.eq.ravel())
        T = red.eq.shape[1]
        seq = idx // T
        F = red.A.reshape(-1, red.A.shape[2])[idx]
        Zs = red.Z[seq]
        G = (F @ F.T) * (Zs @ Zs.T)
        resid = red.b.ravel()[idx] - red.apply(M).ravel()[idx]
        mu = np.linalg.lstsq(G, resid, rcond=1e-13)[0]
        lam = np.zeros(red.eq.size)
        lam[idx] = mu
        M = M + red.adjoint(lam.reshape(red.eq.shape))
    m = red.apply(M)
    pos = red.ineq & (red.b > 0)
    homogeneous_eq = not np.any(red.eq & (red.b != 0))
    if pos.any() and homogeneous_eq and np.all(m[pos] > 0):
        t = float(np.max(red.b[pos] / m[pos]))
        M_t = M * t
        # rescaling can only break inequality rows with b <= 0 whose margin is negative
        if red.violation(red.apply(M_t)) <= red.violation(m) or t >= 1.0:
            cand = red.apply(M_t)
            if red.violation(cand) <= 1e-12 * max(1.0, float(np.abs(red.b * red.scale).max())):
                return M_t
    return M


def _dual_bound(red: _Reduced, lam: NDArray[np.float64]) -> tuple[float, float]:
    """``bᵀλ / max(1, ‖𝒜*λ‖₂)`` and ``‖𝒜*λ‖₂`` for multipliers of the scaled rows."""
    lam = np.where(red.ineq, np.maximum(lam, 0.0), lam) * red.mask
    spec = _spectral(red.adjoint(lam))
    return float((red.b * lam).sum()) / max(1.0, spec), spec


def _rescale_only(red: _Reduced, M: NDArray[np.float64]) -> NDArray[np.float64]:
    """Feasibility repair that keeps the rank of M: for homogeneous equalities, rescaling only."""
    if red.eq.any() and np.any(red.eq & (red.b != 0)):
        return M  # a correction would change the rank; report the violation as is
    m = red.apply(M)
    pos = red.ineq & (red.b > 0)
    if pos.any() and np.all(m[pos] > 0):
        return M * float(np.max(red.b[pos] / m[pos]))
    return M
