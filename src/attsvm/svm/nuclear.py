"""Nuclear-norm attention SVM (Att-SVM*, docs/spec.md §3) and its rank-constrained variant.

Method (and why)
----------------
``min ‖W‖_*  s.t.  a_itᵀ W z_i ≥ b_it (inequalities),  = b_it (equalities)`` is solved by our own
**augmented Lagrangian on the Burer–Monteiro factorisation** of the *reduced* variable:

1. Reduction (docs/spec.md §3, "Structure"): some optimum has the form ``W = U M Vᵀ`` with ``U`` spanning
   the features {a_k} and ``V`` the queries {z_i}; ``M`` is ``r_a × r_z`` with ``r_z ≤ n``.
2. Variational identity ``‖M‖_* = min_{M = KQᵀ} ½(‖K‖_F² + ‖Q‖_F²)``, with ``K`` (r_a, p),
   ``Q`` (r_z, p), ``p ≤ min(r_a, r_z)`` — the nuclear norm becomes a smooth quadratic.
3. Constraints enter through the augmented Lagrangian ``(‖μ‖² − ‖λ‖²)/(2ρ)``,
   ``μ = λ − ρ(𝒜(M) − b)`` (clipped at 0 on inequality rows); each subproblem is smooth and is
   minimised by L-BFGS warm-started from the previous one; ``λ ← μ`` between them. With at most
   400 constraint rows the L-BFGS is our own compact-form one (:func:`_lbfgs`), since scipy's
   wrapper cost more per iteration than the evaluation itself there; above, scipy's L-BFGS-B. The
   lean path is a fast path only: after two polishes (step 4) that did not certify, the solve restarts
   with scipy's L-BFGS-B, whose Wolfe line search gives steadier points on badly scaled data (real
   attention heads); ``info["path"]`` says which ran.
   Every evaluation is a handful of dense products, O(K·(r_a + r_z)·p + n·r_z·p).
   The number of columns p starts small and doubles while all are in use; a dead column is
   re-seeded along the top singular pair of ``𝒜*(λ)`` when that exceeds 1 (saddle escape).
4. Polish: first-order methods stall near 1e-7 relative accuracy, so as early as possible — after
   the first, loosely solved (gtol 1e-3; 1e-2 with at most 400 rows) subproblem once the gap is
   below 0.1 — the rank r and the tight rows S are read off and the smooth KKT system of
   ``min ½(‖K‖² + ‖Q‖²) s.t. 𝒜_S(KQᵀ) = b_S`` (K, Q with r columns) is solved by Newton's method,
   with the (K, Q) block eliminated in the singular basis of ``𝒜*(λ)`` (systems of at most
   160 unknowns: one LU of the whole Jacobian, cheaper there); wrong guesses are
   corrected (rows with λ < 0 released, violated rows added, then a rank added while
   ‖𝒜*(λ)‖₂ > 1). A round whose multipliers already show a wrong sign once its residual is below
   1e-3 is cut short (its set is corrected without converging it to round-off). Newton stops
   as soon as it stagnates (a wrong guess has no KKT point), and
   after two failed rounds the polish hands back to the augmented Lagrangian, which tightens its
   subproblems and polishes again at each tenfold drop of the gap: the slow, safe path stays the
   fallback. This gives primal and dual to round-off (relative gaps ≈ 1e-15 in practice).
5. Certification: the primal is made *exactly* feasible (a least-norm correction on equality rows,
   then a rescaling ``M / min_k(m_k / b_k)``), and the multipliers give the dual bound
   ``bᵀλ / max(1, ‖𝒜*(λ)‖₂)`` (the dual of docs/spec.md §3 is ``max bᵀλ s.t. ‖𝒜*(λ)‖₂ ≤ 1``, λ ≥ 0 on
   inequalities); the loop stops when the relative gap between the two is below ``tol``.

Why not cvxpy: the nuclear norm is an SDP cone there. Interior-point solvers (Clarabel) are
accurate but slow (≈ 120 s at (n, T, d) = (50, 20, 50) on the development machine); SCS is faster
(0.9 s / 7 s / 176 s at (50,20,50) / (100,20,100) / (200,32,128) measured by the issue, on an
idle machine) but first order, with violations around 1e-5 unless pushed (≈ 2 s / ≈ 70 s at
eps 1e-9 for the two middle sizes, against ≈ 0.25 s / 0.7 s here; ``bench_nuclear.py``). This method returns
exactly feasible primals and a certified relative duality gap of ≈ 1e-15 (``bench_nuclear.py``
prints both side by side, with time ratios measured in the same run). The non-convexity of the
factorisation is never trusted blindly: the returned duality gap certifies the answer
independently of how it was found.

Infeasible constraint sets (docs/spec.md §3, theorem of alternatives) are detected by a zero-feature test
and, when the augmented Lagrangian stalls, by a linear program (HiGHS) that finds the certificate
``λ`` (≥ 0 on inequalities, ``bᵀλ = 1``, ``𝒜*(λ) = 0``).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.lapack import dgetrf, dgetrs, dtrtrs
from scipy.optimize import minimize

from .._validation import check_choice, check_finite_scalar, check_positive_int
from ._base import ConstraintSet, RawSolution
from .certificate import find_farkas, relative_violation
from .reduction import Reduction, reduce
from .status import INFEASIBLE, MAX_ITER, OPTIMAL, OPTIMAL_INACCURATE

__all__ = ["solve_nuclear", "solve_nuclear_rank", "NuclearOptions", "infeasibility_certificate", "balanced_factors",
           "NUCLEAR_GAP_TOL", "CONVEX_OPT_RTOL"]

logger = logging.getLogger(__name__)

# Default relative duality gap at which the nuclear solver stops.
NUCLEAR_GAP_TOL = 1e-9
# A rank-constrained solution "reaches the convex optimum" when its objective is within this
# relative tolerance of the convex nuclear optimum.
CONVEX_OPT_RTOL = 1e-6
# Default relative tolerance of the rank-constrained solver.
RANK_GAP_TOL = 1e-8


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
    newton_patience : Newton iterations over which the KKT residual must halve.
    chord_rate, chord_min_rows : a chord Jacobian is refreshed after a step reducing the residual by
        less than chord_rate, and always on systems of at most chord_min_rows rows.
    direct_kkt_max : KKT systems up to this many unknowns are factorised whole.
    early_exit_res, early_exit_lam, early_viol_factor : a Newton round stops early once its residual is
        below early_exit_res while an inequality multiplier is below −early_exit_lam·max|λ|; rows
        violated by more than early_viol_factor × the residual are then added.
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
    newton_patience: int = 5
    chord_rate: float = 0.2
    chord_min_rows: int = 200
    direct_kkt_max: int = 160
    early_exit_res: float = 1e-3
    early_exit_lam: float = 1e-6
    early_viol_factor: float = 100.0

    def __post_init__(self) -> None:
        check_finite_scalar(self.tol, "tol", positive=True)
        check_positive_int(self.max_iter, "max_iter")
        check_positive_int(self.seed, "seed", minimum=0)
        check_choice(self.path, "path", ("auto", "lean", "scipy"))
        check_positive_int(self.p0, "p0")
        check_positive_int(self.inner_max, "inner_max")
        check_positive_int(self.newton_patience, "newton_patience")


@dataclass(frozen=True)
class _ALMRun:
    """How one augmented-Lagrangian run behaves (the mode :func:`_alm` is called in)."""

    tol: float
    max_iter: int
    certify: bool = True        # certify (exactly feasible primal + dual bound) and polish
    grow_rank: bool = False     # double the factor columns while all are in use
    lean: bool = True           # our L-BFGS (else scipy's L-BFGS-B)
    gtol0: float = 1e-3         # gradient tolerance of the first subproblem
    max_failed_polish: int | None = None  # return early after this many polishes that did not certify


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

    A: NDArray[np.float64]      # (n, T, r_a) features / scale (0 where not a constraint)
    Z: NDArray[np.float64]      # (n, r_z)
    b: NDArray[np.float64]      # (n, T) rhs / scale
    ineq: NDArray[np.bool_]     # (n, T)
    eq: NDArray[np.bool_]       # (n, T)
    mask: NDArray[np.bool_]     # (n, T) active constraints (non-zero features)
    scale: NDArray[np.float64]  # (n, T) ‖a_it‖ ‖z_i‖ (1 where masked out)

    def apply(self, M: NDArray[np.float64]) -> NDArray[np.float64]:
        Mz = self.Z @ M.T  # (n, r_a): M z_i
        return np.einsum("ntr,nr->nt", self.A, Mz)

    def apply_factored(self, K: NDArray[np.float64], Q: NDArray[np.float64]) -> NDArray[np.float64]:
        Mz = (self.Z @ Q) @ K.T  # (n, r_a): K Qᵀ z_i
        return np.einsum("ntr,nr->nt", self.A, Mz)

    def adjoint(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        B = np.einsum("nt,ntr->nr", lam, self.A)  # (n, r_a)
        return B.T @ self.Z  # (r_a, r_z)

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
    scale = np.sqrt((cs.A ** 2).sum(-1)) * np.sqrt((cs.Z ** 2).sum(-1))[:, None]  # (n, T)
    mask = cs.mask & (scale > 0)
    s = np.where(mask, scale, 1.0)
    return _Reduced(A=np.where(mask[..., None], cs.A / s[..., None], 0.0), Z=cs.Z,
                    b=np.where(mask, cs.rhs / s, 0.0), ineq=mask & ~cs.equality, eq=mask & cs.equality,
                    mask=mask, scale=s)


# ----------------------------------------------------------------------------- helpers
def balanced_factors(W: NDArray[np.float64], rank: int | None = None
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


def infeasibility_certificate(cs: ConstraintSet) -> NDArray[np.float64] | None:
    """A verified Farkas certificate λ (n, T) of ``cs`` (docs/spec.md §3), or None when feasible.

    The one route of :func:`~attsvm.svm.certificate.find_farkas` (zero rows, then the LP in
    normalised units), normalised to ``Σ|λ_k| = 1``.
    """
    cert = find_farkas(cs)
    return None if cert is None else cert.lam


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


@dataclass
class _Polished:
    K: NDArray[np.float64]
    Q: NDArray[np.float64]
    lam: NDArray[np.float64]  # (n, T) multipliers of the scaled rows
    residual: float
    rounds: int


def _newton_solver(Fs: NDArray[np.float64], Zs: NDArray[np.float64], K: NDArray[np.float64],
                   Q: NDArray[np.float64], lam_s: NDArray[np.float64], *, delta: float = 1e-7, tau: float = 1e-3):
    """Factor the Jacobian J of the KKT system of :func:`_kkt_newton` at (K, Q, λ_S); return ``F ↦ −J⁻¹F``.

    The returned function is reused for several (chord) steps while it keeps converging fast.

    ``J = [[H, −C], [Cᵀ, 0]]`` with ``H(ΔK, ΔQ) = (ΔK − YΔQ, ΔQ − YᵀΔK) + δ·(ΔK, ΔQ)``. In the
    singular bases of ``Y = U diag(σ) Vᵀ`` the pairs ``(Uᵀ ΔK ± Vᵀ ΔQ)/√2`` diagonalise H with
    eigenvalues ``1 ∓ σ_i + δ``; the coordinates with ``|h| ≥ tau`` are eliminated, leaving a
    dense system of size (#{σ ≈ 1}·r + |S|) instead of ((r_a + r_z)·r + |S|). ``δ`` removes the
    orthogonal gauge ``(K O, Q O)`` (round-off stays ≪ δ, so the gauge never pollutes the step).
    """
    r_a, r = K.shape
    r_z = Q.shape[0]
    s = lam_s.size
    nK, nQ = r_a * r, r_z * r
    Y = (Fs * lam_s[:, None]).T @ Zs  # (r_a, r_z)
    U, sig, Vt = np.linalg.svd(Y, full_matrices=True)
    V = Vt.T
    q = sig.size
    c = np.sqrt(0.5)

    def to_xi(XK: NDArray[np.float64], XQ: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        # (ΔK, ΔQ) -> coordinates (u, w, rest) in the eigenbasis of H
        a = U.T @ XK
        b = V.T @ XQ
        return c * (a[:q] + b[:q]), c * (a[:q] - b[:q]), a[q:], b[q:]

    def from_xi(u: NDArray[np.float64], w: NDArray[np.float64], ra: NDArray[np.float64], rb: NDArray[np.float64]
                ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return U @ np.vstack([c * (u + w), ra]), V @ np.vstack([c * (u - w), rb])

    h_m = 1.0 - sig + delta  # eigenvalues on the u coordinates (≈ δ where σ_i ≈ 1)
    h_p = 1.0 + sig + delta  # on the w coordinates
    h_r = 1.0 + delta  # on the remaining ones
    Ri = np.abs(h_m) < tau  # u rows kept in the reduced system (all r columns each)
    eu = np.where(Ri, 0.0, 1.0 / np.where(Ri, 1.0, h_m))
    FK, ZQ = Fs @ K, Zs @ Q  # (s, r): Kᵀa_k and Qᵀz_k
    At = (Fs @ U).T  # (r_a, s): Uᵀ a_k
    Zt = (Zs @ V).T  # (r_z, s): Vᵀ z_k
    # The constraint gradient C_k = (a_k (Qᵀz_k)ᵀ, z_k (Kᵀa_k)ᵀ) has u/w coordinates
    # c(ã_ki q̃_kj ± z̃_ki k̃_kj); the Schur complement S = Σ_E C_k C_lᵀ / h needs only s × s products.
    Gqq, Gkk, Gqk = ZQ @ ZQ.T, FK @ FK.T, ZQ @ FK.T
    Au, Zu = At[:q], Zt[:q]
    ap = eu + 1.0 / h_p
    am = eu - 1.0 / h_p
    X = (Au.T * am) @ Zu * Gqk  # the two cross terms are X + Xᵀ
    Sm = 0.5 * ((Au.T * ap) @ Au * Gqq + (Zu.T * ap) @ Zu * Gkk + X + X.T)
    Sm += (At[q:].T @ At[q:]) * Gqq / h_r + (Zt[q:].T @ Zt[q:]) * Gkk / h_r
    # u coordinates kept (σ_i ≈ 1): ChR (nRi·r, s)
    ChR = (c * (At[:q][Ri][:, None, :] * ZQ.T[None] + Zt[:q][Ri][:, None, :] * FK.T[None])).reshape(-1, s)
    hR = np.repeat(h_m[Ri], r)
    nR = hR.size
    Jr = np.zeros((nR + s, nR + s))
    Jr[np.arange(nR), np.arange(nR)] = hR
    Jr[:nR, nR:] = -ChR
    Jr[nR:, :nR] = ChR.T
    Jr[nR:, nR:] = Sm
    # LAPACK's LU directly: scipy's wrappers cost more than the factorisation at these sizes
    lu, piv, info = dgetrf(Jr, overwrite_a=1)
    if info == 0:
        solve = lambda b: dgetrs(lu, piv, b)[0]  # noqa: E731
    else:  # pragma: no cover - singular reduced system
        pinv = np.linalg.pinv(Jr)
        solve = lambda b: pinv @ b  # noqa: E731

    def step(F: NDArray[np.float64]) -> NDArray[np.float64]:
        fu, fw, fa, fb = to_xi(-F[:nK].reshape(r_a, r), -F[nK:nK + nQ].reshape(r_z, r))
        g = -F[nK + nQ:]
        # Cᵀ D⁻¹ f over the eliminated coordinates, through the orthogonal inverse transform
        GK, GQ = from_xi(fu * eu[:, None], fw / h_p[:, None], fa / h_r, fb / h_r)
        ctf = ((Fs @ GK) * ZQ).sum(1) + ((Zs @ GQ) * FK).sum(1)
        sol = solve(np.concatenate([fu[Ri].ravel(), g - ctf]))
        dlam = sol[nR:]
        du, dw, da, db = to_xi(Fs.T @ (dlam[:, None] * ZQ), Zs.T @ (dlam[:, None] * FK))  # C·Δλ
        xu = (fu + du) * eu[:, None]
        xu[Ri] = sol[:nR].reshape(-1, r)
        dK, dQ = from_xi(xu, (fw + dw) / h_p[:, None], (fa + da) / h_r, (fb + db) / h_r)
        return np.concatenate([dK.ravel(), dQ.ravel(), dlam])

    return step


def _newton_solver_direct(Fs: NDArray[np.float64], Zs: NDArray[np.float64], K: NDArray[np.float64],
                          Q: NDArray[np.float64], lam_s: NDArray[np.float64], *, delta: float = 1e-7):
    """The same ``F ↦ −J⁻¹F`` as :func:`_newton_solver`, by one LU of the whole Jacobian.

    ``J = [[(1 + δ)I, −Y ⊗ I_r, −C_K], [−Yᵀ ⊗ I_r, (1 + δ)I, −C_Q], [C_Kᵀ, C_Qᵀ, 0]]`` (row-major
    vec of K and Q, then λ_S; ``C_K``'s column k is vec(a_k (Qᵀz_k)ᵀ), ``C_Q``'s vec(z_k (Kᵀa_k)ᵀ)).
    For small systems (at most ``NuclearOptions.direct_kkt_max`` unknowns) assembling and factorising it is
    cheaper than the elimination in the singular basis of Y, whose many small products dominate there.
    """
    r_a, r = K.shape
    r_z = Q.shape[0]
    s = lam_s.size
    nK, nQ = r_a * r, r_z * r
    nX = nK + nQ
    Y = (Fs * lam_s[:, None]).T @ Zs  # (r_a, r_z)
    FK, ZQ = Fs @ K, Zs @ Q  # (s, r): Kᵀa_k and Qᵀz_k
    CK = (Fs[:, :, None] * ZQ[:, None, :]).reshape(s, nK)
    CQ = (Zs[:, :, None] * FK[:, None, :]).reshape(s, nQ)
    B = np.zeros((r_a, r, r_z, r))
    ar = np.arange(r)
    B[:, ar, :, ar] = -Y  # ∂(K − YQ)/∂Q = −Y ⊗ I_r
    B = B.reshape(nK, nQ)
    J = np.zeros((nX + s, nX + s))
    J.flat[: nX * (nX + s + 1): nX + s + 1] = 1.0 + delta
    J[:nK, nK:nX] = B
    J[nK:nX, :nK] = B.T
    J[:nK, nX:] = -CK.T
    J[nK:nX, nX:] = -CQ.T
    J[nX:, :nK] = CK
    J[nX:, nK:nX] = CQ
    lu, piv, info = dgetrf(J, overwrite_a=1)
    if info == 0:
        return lambda F: -dgetrs(lu, piv, F)[0]
    pinv = np.linalg.pinv(J)  # pragma: no cover - singular system
    return lambda F: -(pinv @ F)


def _kkt_newton(red: _Reduced, idx: NDArray[np.int64], K: NDArray[np.float64], Q: NDArray[np.float64],
                lam_s: NDArray[np.float64], opt: NuclearOptions, *, max_newton: int = 30, ftol: float = 1e-13,
                ineq_s: NDArray[np.bool_] | None = None
                ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], float]:
    """Newton's method on the smooth KKT system of the fixed-rank, fixed-active-set problem.

    ``min ½(‖K‖² + ‖Q‖²) s.t. a_kᵀ K Qᵀ z_k = b_k (k ∈ S)`` has the optimality conditions
    ``K = Y Q``, ``Q = Yᵀ K``, ``𝒜_S(K Qᵀ) = b_S`` with ``Y = Σ_S λ_k a_k z_kᵀ`` — a square system in
    (K, Q, λ_S), singular only along the orthogonal gauge ``(K O, Q O)``, which a tiny Tikhonov
    term on the (K, Q) block removes. Converges quadratically from the augmented-Lagrangian point.

    ``ineq_s`` (bool over S, the inequality rows) enables an early exit: once the residual is below
    ``NuclearOptions.early_exit_res`` and some inequality row has a clearly negative multiplier, this active
    set is wrong (the polish will release that row), so converging it to round-off is wasted work.
    """
    T = red.mask.shape[1]
    r_a, r = K.shape
    r_z = Q.shape[0]
    s = idx.size
    Fs = red.A.reshape(-1, r_a)[idx]  # (s, r_a)
    Zs = red.Z[idx // T]  # (s, r_z)
    bs = red.b.ravel()[idx]
    nK, nQ = r_a * r, r_z * r

    def resid(K: NDArray[np.float64], Q: NDArray[np.float64], lam: NDArray[np.float64]) -> NDArray[np.float64]:
        Y = (Fs * lam[:, None]).T @ Zs
        c = np.einsum("ka,ka->k", Fs @ K, Zs @ Q) - bs
        return np.concatenate([(K - Y @ Q).ravel(), (Q - Y.T @ K).ravel(), c])

    F = resid(K, Q, lam_s)
    nrm = float(np.linalg.norm(F))
    solver = None
    fresh = False
    hist = [nrm]
    for it in range(max_newton):
        if nrm <= ftol:
            break
        if ineq_s is not None and nrm <= opt.early_exit_res and _wrong_sign(lam_s, ineq_s, opt.early_exit_lam):
            break
        # stagnation: a wrong rank / active-set guess has no KKT point; Newton then crawls. Give up
        # early (the caller corrects the guess) instead of spending max_newton factorisations.
        if it >= opt.newton_patience and nrm > 0.5 * hist[-opt.newton_patience]:
            break
        if solver is None:
            small = (r_a + r_z) * K.shape[1] + s <= opt.direct_kkt_max
            solver, fresh = (_newton_solver_direct if small else _newton_solver)(Fs, Zs, K, Q, lam_s), True
        step = solver(F)
        t = 1.0
        for _ls in range(30):
            Kn = K + t * step[:nK].reshape(r_a, r)
            Qn = Q + t * step[nK:nK + nQ].reshape(r_z, r)
            ln = lam_s + t * step[nK + nQ:]
            Fn = resid(Kn, Qn, ln)
            nn = float(np.linalg.norm(Fn))
            if np.isfinite(nn) and nn < (1 - 1e-4 * t) * nrm:
                break
            t *= 0.5
        else:
            if fresh:
                break
            solver = None  # the stale (chord) Jacobian failed: refactor at the current point
            continue
        if t < 1.0 or nn > opt.chord_rate * nrm or s <= opt.chord_min_rows:
            solver = None  # slow progress: refresh the Jacobian next time (Newton, not chord)
        fresh = False
        K, Q, lam_s, F, nrm = Kn, Qn, ln, Fn, nn
        hist.append(nrm)
    return K, Q, lam_s, nrm


def _wrong_sign(lam_s: NDArray[np.float64], ineq_s: NDArray[np.bool_], rtol: float) -> bool:
    """Does an inequality row carry a multiplier below −rtol·max|λ| (the active set must change)?"""
    return bool(np.any(lam_s[ineq_s] < -rtol * np.abs(lam_s).max(initial=0.0)))


def _polish(red: _Reduced, M: NDArray[np.float64], lam0: NDArray[np.float64], opt: NuclearOptions, *,
            max_rounds: int = 8,
            max_failed: int = 2, rank_rtol: float = 1e-6, tight_rtol: float = 1e-3) -> _Polished | None:
    """Active-set Newton polish: guess the rank r and the tight rows S from an approximate solution,
    solve the KKT system by :func:`_kkt_newton`, then fix the guess (drop rows with λ < 0, add
    violated rows, add a rank when ``‖𝒜*λ‖₂ > 1``) until the KKT conditions hold."""
    n, T = red.mask.shape
    U, sv, Vt = np.linalg.svd(M, full_matrices=False)
    if sv.size == 0 or sv[0] == 0:
        return None
    r = max(1, int((sv > rank_rtol * sv[0]).sum()))
    K = U[:, :r] * np.sqrt(sv[:r])
    Q = Vt[:r].T * np.sqrt(sv[:r])
    m = red.apply(M)
    lam_n = lam0 / max(1e-300, float(np.abs(lam0).max(initial=0.0)))
    S = red.mask & (red.eq | (np.abs(m - red.b) <= tight_rtol * np.maximum(1.0, np.abs(red.b)))
                    | (lam_n > 1e-3))
    lam_full = lam0.copy()
    res = np.inf
    failed = 0
    for rounds in range(1, max_rounds + 1):
        idx = np.flatnonzero(S.ravel())
        if idx.size == 0:
            return None
        ineq_s = red.ineq.ravel()[idx]
        K, Q, lam_s, res = _kkt_newton(red, idx, K, Q, lam_full.ravel()[idx], opt, ineq_s=ineq_s)
        # a guess far from the optimum keeps Newton from converging round after round: hand back to
        # the augmented Lagrangian (cheaper than more Newton rounds) and retry from a better point.
        # An early exit on a wrong-signed multiplier (see _kkt_newton) is progress, not a failure.
        early = 1e-10 < res <= opt.early_exit_res and _wrong_sign(lam_s, ineq_s, opt.early_exit_lam)
        failed = failed + 1 if res > 1e-10 and not early else 0
        if failed >= max_failed:
            return None
        lam_full = np.zeros(n * T)
        lam_full[idx] = lam_s
        lam_full = lam_full.reshape(n, T)
        m = red.apply_factored(K, Q)
        changed = False
        neg = red.ineq & S & (lam_full < 0)
        if neg.any():  # these rows are not active: release the most negative ones
            S = S & ~neg
            lam_full = np.where(neg, 0.0, lam_full)
            changed = True
        # (after an early exit the point is only accurate to ~res: a row counts as violated only
        # beyond _EARLY_VIOL_FACTOR·res, so that round-off of the unconverged point adds nothing)
        vtol = max(1e-12, opt.early_viol_factor * res) if early else 1e-12
        viol = red.ineq & ~S & (m < red.b - vtol * np.maximum(1.0, np.abs(red.b)))
        if viol.any():
            S = S | viol
            changed = True
        Y = red.adjoint(lam_full)
        Uy, sy, Vyt = np.linalg.svd(Y, full_matrices=False)
        # dual feasibility ‖Y‖₂ ≤ 1: a singular value above 1 marks a direction the primal must use
        # (only once the active set has settled: λ from a wrong set overstates ‖𝒜*(λ)‖₂, and a
        # spurious extra column makes the next Newton solve degenerate and slow)
        if sy[0] > 1.0 + 1e-9 and r < min(Y.shape) and not changed:
            eps = 1e-3 * float(np.sqrt(np.abs(K).max() * np.abs(Q).max()))
            K = np.hstack([K, eps * Uy[:, :1]])
            Q = np.hstack([Q, eps * Vyt[:1].T])
            r += 1
            changed = True
        # rank guessed too high: a direction of K Qᵀ vanished. Refactor with fewer columns, so that the
        # spare singular values of 𝒜*(λ) are free to stay ≤ 1 (else the dual is ill-determined)
        Um, sm, Vmt = np.linalg.svd(K @ Q.T, full_matrices=False)
        r_new = int((sm > 1e-9 * sm[0]).sum())
        if 1 <= r_new < r and not changed:
            root = np.sqrt(sm[:r_new])
            K, Q, r = Um[:, :r_new] * root, Vmt[:r_new].T * root, r_new
            changed = True
        if not changed and res <= 1e-10:
            return _Polished(K, Q, lam_full, res, rounds)
    return None


def _dual_bound(red: _Reduced, lam: NDArray[np.float64]) -> tuple[float, float]:
    """``bᵀλ / max(1, ‖𝒜*λ‖₂)`` and ``‖𝒜*λ‖₂`` for multipliers of the scaled rows."""
    lam = np.where(red.ineq, np.maximum(lam, 0.0), lam) * red.mask
    spec = _spectral(red.adjoint(lam))
    return float((red.b * lam).sum()) / max(1.0, spec), spec


# ----------------------------------------------------------------------------- L-BFGS
def _lbfgs(fg, x: NDArray[np.float64], *, gtol: float, max_iter: int, memory: int = 20, max_halvings: int = 40
           ) -> tuple[NDArray[np.float64], int]:
    """Minimise a smooth function by L-BFGS until ``max|∇f| ≤ gtol``; returns (x, iterations).

    ``fg(x) -> (f, ∇f)``. A lean replacement for scipy's L-BFGS-B on our small, unconstrained
    subproblems, where the wrapper's per-iteration overhead cost more than the evaluation itself.
    The inverse-Hessian product uses the compact representation of Byrd, Nocedal & Schnabel (1994)
    (Nocedal & Wright, eq. 7.24): ``H g = γg + S u − γ Y w`` with ``R w = Sᵀg`` and
    ``Rᵀ u = (D + γYᵀY) w − γYᵀg`` — two triangular solves of size ``memory`` and three products
    with the (memory, len x) history, instead of a Python loop over the pairs. The step is an Armijo
    backtracking search from 1 (from ``1/‖g‖`` on the first iteration); a pair is stored only when
    ``sᵀy > 0`` (so H stays positive definite). Stops early when no decrease is possible any more.
    """
    f, g = fg(x)
    nv = x.size
    H = np.empty((2, memory, nv))  # the stored pairs: H[0] = S (s_i rows), H[1] = Y (y_i rows)
    S, Y = H[0], H[1]
    SY = np.empty((memory, memory))  # SY[i, j] = s_iᵀ y_j (upper triangle: R; diagonal: D)
    YY = np.empty((memory, memory))
    k = 0
    gamma = 1.0
    it = 0
    for it in range(1, max_iter + 1):
        if np.abs(g).max(initial=0.0) <= gtol:
            return x, it - 1
        if k == 0:
            d = -g
            t = min(1.0, 1.0 / max(float(np.sqrt(g @ g)), 1e-300))
        else:
            a, c = H[:, :k] @ g  # Sᵀg, Yᵀg
            R = SY[:k, :k]
            w, _ = dtrtrs(R, a, lower=0, trans=0)
            u, _ = dtrtrs(R, R.diagonal() * w + gamma * (YY[:k, :k] @ w - c), lower=0, trans=1)
            d = gamma * (w @ Y[:k] - g) - u @ S[:k]
            t = 1.0
        slope = float(g @ d)
        if slope >= 0:  # not a descent direction (round-off): restart from the gradient
            k, d, slope = 0, -g, -float(g @ g)
            t = min(1.0, 1.0 / max(float(np.sqrt(-slope)), 1e-300))
        for _ in range(max_halvings):
            xn = x + t * d
            fn, gn = fg(xn)
            if fn <= f + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            return x, it  # no decrease along d: x is stationary to round-off
        s_new = xn - x
        y_new = gn - g
        sy = float(s_new @ y_new)
        yy_new = float(y_new @ y_new)
        if sy > 1e-12 * float(np.sqrt((s_new @ s_new) * yy_new)):
            if k == memory:  # drop the oldest pair (numpy copies overlapping slices safely)
                H[:, :-1] = H[:, 1:]
                SY[:-1, :-1] = SY[1:, 1:]
                YY[:-1, :-1] = YY[1:, 1:]
                k -= 1
            S[k] = s_new
            Y[k] = y_new
            SY[:k, k] = S[:k] @ y_new
            SY[k, :k] = Y[:k] @ s_new
            SY[k, k] = sy
            yy = Y[:k] @ y_new
            YY[:k, k] = yy
            YY[k, :k] = yy
            YY[k, k] = yy_new
            gamma = sy / yy_new
            k += 1
        stop = f - fn <= 1e-16 * max(abs(f), abs(fn), 1.0)
        x, f, g = xn, fn, gn
        if stop:
            return x, it
    return x, it


# ----------------------------------------------------------------------------- the ALM engine
@dataclass
class _ALMResult:
    K: NDArray[np.float64]
    Q: NDArray[np.float64]
    lam: NDArray[np.float64]
    primal: float
    dual: float
    gap: float
    violation: float
    n_outer: int
    n_inner: int
    stalled: bool
    converged: bool
    M: NDArray[np.float64] | None = None  # the exactly feasible primal whose ‖·‖_* is ``primal`` (certify)


def _alm(red: _Reduced, K: NDArray[np.float64], Q: NDArray[np.float64], opt: NuclearOptions, run: _ALMRun, *,
         rho: float | None = None, lam: NDArray[np.float64] | None = None,
         rng: np.random.Generator | None = None) -> _ALMResult:
    """Augmented Lagrangian on ``M = K Qᵀ`` with the objective ``½(‖K‖² + ‖Q‖²)`` (module doc).

    ``run`` says how this run behaves (:class:`_ALMRun`): with ``grow_rank`` the number of columns p
    starts small and doubles (up to min(r_a, r_z)) whenever every column of the current factors is
    in use, so that a low-rank optimum is found with few variables; ``lean`` picks our L-BFGS over
    scipy's; ``max_failed_polish`` returns early (not converged) after that many polish attempts that
    did not certify, so that the caller can switch paths (see :func:`solve_nuclear`). ``opt`` holds
    the tuning constants (:class:`NuclearOptions`).
    """
    tol, max_iter, certify, grow_rank = run.tol, run.max_iter, run.certify, run.grow_rank
    lean, max_failed_polish, inner_max = run.lean, run.max_failed_polish, opt.inner_max
    r_a, p = K.shape
    r_z = Q.shape[0]
    p_max = min(r_a, r_z)
    rng = np.random.default_rng(0) if rng is None else rng
    lam = np.zeros_like(red.b) if lam is None else lam.copy()
    mask, ineq = red.mask, red.ineq
    if rho is None:
        rho = max(1.0, float(np.sqrt(mask.sum())))

    failed_polish = 0
    # the constraint rows flattened once: every evaluation is then a few dense products on (K_c, ·)
    idx = np.flatnonzero(mask.ravel())
    Fs = red.A.reshape(-1, r_a)[idx]  # (K_c, r_a) features a_k
    seq = idx // mask.shape[1]
    Zs = red.Z[seq]  # (K_c, r_z) queries z_k
    bs = red.b.ravel()[idx]
    ineq_s = ineq.ravel()[idx]

    def fg(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        p = x.size // (r_a + r_z)
        nK = r_a * p
        Kx = x[:nK].reshape(r_a, p)
        Qx = x[nK:].reshape(r_z, p)
        FK = Fs @ Kx  # (K_c, p): Kᵀa_k
        ZQ = (red.Z @ Qx)[seq]  # (K_c, p): Qᵀz_k
        mu = shift - rho * np.einsum("kp,kp->k", FK, ZQ)  # λ − ρ(𝒜(KQᵀ) − b)
        np.maximum(mu, 0.0, out=mu, where=ineq_s)
        f = 0.5 * (x @ x) + (mu @ mu - lam_sq) / (2 * rho)
        # Y = 𝒜*(μ) = Σ μ_k a_k z_kᵀ; grad_K = K − Y Q, grad_Q = Q − Yᵀ K, without forming Y
        g = x.copy()
        g[:nK] -= (Fs.T @ (mu[:, None] * ZQ)).ravel()
        g[nK:] -= (Zs.T @ (mu[:, None] * FK)).ravel()
        return float(f), g

    def fg_nt(x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        # the same function on the (n, T) layout, for scipy's L-BFGS-B on large problems. Kept as it
        # was: the first polish is tried from a loosely solved subproblem, and whether it succeeds
        # there can hinge on round-off-level differences of the L-BFGS path (a failure costs an
        # extra outer iteration), so the large sizes keep the path their benchmarks were measured on.
        p = x.size // (r_a + r_z)
        nK = r_a * p
        Kx = x[:nK].reshape(r_a, p)
        Qx = x[nK:].reshape(r_z, p)
        c = red.apply_factored(Kx, Qx) - red.b
        mu = lam - rho * c
        mu = np.where(ineq, np.maximum(mu, 0.0), mu) * mask
        f = 0.5 * (np.vdot(Kx, Kx) + np.vdot(Qx, Qx)) + (np.vdot(mu, mu) - np.vdot(lam * mask, lam)) / (2 * rho)
        B = np.einsum("nt,ntr->nr", mu, red.A)  # (n, r_a)
        gK = Kx - B.T @ (red.Z @ Qx)
        gQ = Qx - red.Z.T @ (B @ Kx)
        return float(f), np.concatenate([gK.ravel(), gQ.ravel()])

    x = np.concatenate([K.ravel(), Q.ravel()])
    n_inner = 0
    best: _ALMResult | None = None
    prev_viol = np.inf
    stall = 0
    scale_b = max(1.0, float(np.abs(red.b).max(initial=0.0)))
    gtol = run.gtol0
    next_polish = opt.polish_gap
    for outer in range(1, max_iter + 1):
        lam_s = lam.ravel()[idx]
        shift, lam_sq = lam_s + rho * bs, float(lam_s @ lam_s)  # constants of this subproblem
        for _attempt in range(2):
            if lean:
                x, nit = _lbfgs(fg, x, gtol=gtol, max_iter=inner_max, memory=opt.lbfgs_memory,
                                max_halvings=opt.lbfgs_max_halvings)
            else:  # large subproblems: the evaluation dominates, and scipy's line search is the safer one
                res = minimize(fg_nt, x, jac=True, method="L-BFGS-B",
                               options={"maxiter": inner_max, "maxcor": opt.lbfgs_memory, "gtol": gtol, "ftol": 1e-16})
                x, nit = res.x, int(res.nit)
            n_inner += nit
            if np.any(x):
                break
            # K = Q = 0 is stationary for every λ (a saddle): from a strictly feasible start, where the
            # penalty is inactive and f = ½‖x‖², a quasi-Newton step can land on it exactly. Restart
            # along the descent directions there, the top singular pairs of 𝒜*(μ) at M = 0.
            logger.debug("  factors collapsed onto K = Q = 0: restarting along 𝒜*(μ)")
            x = np.concatenate([v.ravel() for v in _escape_origin(red, lam, rho, p)])
        nK = r_a * p
        Kx = x[:nK].reshape(r_a, p)
        Qx = x[nK:].reshape(r_z, p)
        m = red.apply_factored(Kx, Qx)
        c = m - red.b
        lam = lam - rho * c
        lam = np.where(ineq, np.maximum(lam, 0.0), lam) * mask
        raw_viol = float(np.max(np.where(ineq, np.maximum(-c, 0.0), np.where(red.eq, np.abs(c), 0.0)),
                                initial=0.0))
        lam_cert = lam
        if certify:
            M = Kx @ Qx.T
            Mf = _make_feasible(red, M)
            viol = red.violation(red.apply(Mf))
            primal = _nuclear(Mf)
            dual, spec = _dual_bound(red, lam)
            gap = (primal - dual) / max(primal, 1e-300)
            if gap > tol and viol <= 1e-9 * scale_b and gap <= next_polish:
                next_polish = gap * 0.1
                _tp = time.perf_counter()
                # first the rank read off with a loose threshold (fewer, better-conditioned Newton
                # rounds), then, if that fails, the conservative guess of every non-negligible direction
                pol = _polish(red, M, lam, opt, rank_rtol=opt.rank_rtol_fast)
                if pol is None:
                    pol = _polish(red, M, lam, opt, rank_rtol=opt.rank_rtol_safe)
                logger.debug("  polish took %.2fs", time.perf_counter() - _tp)
                if pol is not None:
                    Mp = _make_feasible(red, pol.K @ pol.Q.T)
                    vp = red.violation(red.apply(Mp))
                    pp = _nuclear(Mp)
                    dp, _ = _dual_bound(red, pol.lam)
                    gp = (pp - dp) / max(pp, 1e-300)
                    logger.debug("  polish: rounds=%d res=%.1e primal=%.15g dual=%.15g gap=%.2e viol=%.1e",
                                 pol.rounds, pol.residual, pp, dp, gp, vp)
                    if vp <= 1e-9 * scale_b and gp < gap:
                        Kx, Qx, viol, primal, dual, gap, lam_cert = pol.K, pol.Q, vp, pp, dp, gp, pol.lam
                        Mf = Mp
                if pol is None or gap > tol:
                    failed_polish += 1
        else:
            viol, primal, dual, gap = raw_viol, 0.5 * float(np.vdot(Kx, Kx) + np.vdot(Qx, Qx)), -np.inf, np.inf
            Mf = None
        cur = _ALMResult(Kx.copy(), Qx.copy(), lam_cert.copy(), primal, dual, gap, viol, outer, n_inner, False, False,
                         Mf)
        logger.debug("ALM outer %d: rho=%.2e inner=%d viol=%.2e primal=%.12g dual=%.12g gap=%.2e",
                      outer, rho, nit, raw_viol, primal, dual, gap)
        if certify and (best is None or _better(cur, best, 1e-9 * scale_b)):
            best = cur
        elif not certify:
            best = cur
        feas_tol = 1e-9 * scale_b
        if certify and viol <= feas_tol and gap <= tol:
            best = cur
            best.converged = True
            return best
        if not certify and raw_viol <= max(tol, 1e-12) * scale_b and outer > 1:
            best.converged = True
            return best
        if max_failed_polish is not None and failed_polish >= max_failed_polish:
            assert best is not None
            return best
        # penalty update: raise rho when the violation does not drop fast enough
        if raw_viol > 0.25 * prev_viol and raw_viol > 1e-10 * scale_b:
            rho = min(rho * 5.0, opt.rho_max)
            stall = stall + 1 if rho >= opt.rho_max else stall
        prev_viol = raw_viol
        if grow_rank and certify:
            # saddle escape: a singular value of 𝒜*(λ) above 1 is a descent direction (u₁, v₁) of the
            # Lagrangian ½(‖K‖² + ‖Q‖²) − ⟨𝒜*(λ), KQᵀ⟩; put it into a dead column if there is one
            Uy, sy, Vyt = np.linalg.svd(red.adjoint(lam), full_matrices=False)
            if sy[0] > 1.0 + 1e-6:
                Um, sm, Vmt = np.linalg.svd(Kx @ Qx.T, full_matrices=False)
                if sm[p - 1] < 1e-6 * sm[0]:  # the factorisation does not use all p directions
                    root = np.sqrt(sm[:p])
                    Kx = Um[:, :p] * root
                    Qx = Vmt[:p].T * root
                    eps = 1e-2 * float(np.sqrt(sm[0]))
                    Kx[:, p - 1] = eps * Uy[:, 0]
                    Qx[:, p - 1] = eps * Vyt[0]
                    x = np.concatenate([Kx.ravel(), Qx.ravel()])
                    logger.debug("  saddle escape: sigma_1(A*lam) = %.6f, re-seeded a dead direction", sy[0])
        if grow_rank and p < p_max:
            col = np.linalg.norm(Kx, axis=0) * np.linalg.norm(Qx, axis=0)
            if col.min() > 1e-3 * col.max():
                p_new = min(2 * p, p_max)
                eps = 1e-3 * float(np.sqrt(col.max()))
                Kx = np.hstack([Kx, eps * rng.standard_normal((r_a, p_new - p))])
                Qx = np.hstack([Qx, eps * rng.standard_normal((r_z, p_new - p))])
                p = p_new
                x = np.concatenate([Kx.ravel(), Qx.ravel()])
                logger.debug("  rank grown to p=%d", p)
        gtol = max(1e-13, min(gtol, 0.1 * raw_viol + 1e-13, 1e-2 * abs(gap) if np.isfinite(gap) else gtol))
        if stall >= 3:
            assert best is not None
            best.stalled = True
            return best
    assert best is not None
    return best


def _escape_origin(red: _Reduced, lam: NDArray[np.float64], rho: float, p: int, *, eps: float = 1e-2
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Factors (K, Q) with p columns near the saddle K = Q = 0 of the augmented Lagrangian, along its
    descent directions: at M = 0 the multipliers are ``μ = λ + ρb`` (clipped on inequalities) and
    ``f(εu, εv) ≈ f(0) + ε²(½‖u‖² + ½‖v‖² − uᵀ𝒜*(μ)v)``, which decreases along the top singular
    pairs of ``𝒜*(μ)`` whose singular value exceeds 1. Returns ``ε·U_p √σ_p``, ``ε·V_p √σ_p``."""
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    mu = np.where(red.ineq, np.maximum(lam + rho * red.b, 0.0), lam + rho * red.b) * red.mask
    U, sig, Vt = np.linalg.svd(red.adjoint(mu), full_matrices=False)
    q = min(p, sig.size)
    root = eps * np.sqrt(sig[:q])
    K = np.zeros((r_a, p))
    Q = np.zeros((r_z, p))
    K[:, :q] = U[:, :q] * root
    Q[:, :q] = Vt[:q].T * root
    return K, Q


def _better(a: _ALMResult, b: _ALMResult, feas_tol: float) -> bool:
    """Is ``a`` a better certified point than ``b``: feasible first, then the smaller gap."""
    fa, fb = a.violation <= feas_tol, b.violation <= feas_tol
    if fa != fb:
        return fa
    return a.gap < b.gap if fa else a.violation < b.violation


def _initial_factors(red: _Reduced, p: int, rng: np.random.Generator, *, noise: float = 1e-3
                     ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Balanced factors of a rescaled ``𝒜*(b)`` (a cheap point aligned with the constraints) plus noise."""
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    M0 = red.adjoint(np.where(red.mask, np.maximum(red.b, 0.0) + (red.b == 0), 0.0))
    m0 = red.apply(M0)
    pos = red.ineq & (red.b > 0)
    if pos.any() and np.all(m0[pos] > 0):
        M0 = M0 * float(np.max(red.b[pos] / m0[pos]))
    K, Q = balanced_factors(M0, rank=p)
    pad_k = np.zeros((r_a, p))
    pad_q = np.zeros((r_z, p))
    pad_k[:, : K.shape[1]] = K
    pad_q[:, : Q.shape[1]] = Q
    s = noise * max(1.0, float(np.sqrt(np.abs(pad_k).max(initial=0.0) * np.abs(pad_q).max(initial=0.0))))
    return pad_k + s * rng.standard_normal((r_a, p)), pad_q + s * rng.standard_normal((r_z, p))


def _lift_dual(red: _Reduced, lam_scaled: NDArray[np.float64]) -> NDArray[np.float64]:
    """Multipliers of the scaled rows → multipliers of the original rows, shape (n, T)."""
    lam = lam_scaled / red.scale * red.mask
    return np.where(red.ineq, np.maximum(lam, 0.0), lam)


def _trivial(cs: ConstraintSet, reduction: Reduction, red: _Reduced, t0: float, solver: str
             ) -> RawSolution | None:
    """Handle the infeasible-by-inspection and constraint-free cases; None otherwise."""
    if reduction.unattainable.any():
        cert = find_farkas(cs, red=reduction, lp=False)
        assert cert is not None
        return RawSolution(None, cert.lam, INFEASIBLE, 0,
                           {"solver": solver, "reason": "zero constraint feature with positive right-hand side",
                            "time": time.perf_counter() - t0})
    # W = 0 satisfies every row when b ≤ 0 on the inequalities and b = 0 on the equalities, and has the
    # smallest possible norm: exact, with λ = 0 (the augmented Lagrangian would only crawl towards it)
    homogeneous = bool(np.all(cs.rhs[cs.inequality] <= 0) and np.all(cs.rhs[cs.equality] == 0))
    if homogeneous or not red.mask.any() or red.A.shape[2] == 0 or red.Z.shape[1] == 0:
        d = cs.d
        return RawSolution(np.zeros((d, d)), np.zeros(cs.mask.shape), OPTIMAL, 0,
                           {"solver": solver, "objective": 0.0, "dual_objective": 0.0, "relative_gap": 0.0,
                            "time": time.perf_counter() - t0})
    return None


def _check_cs(cs: ConstraintSet) -> None:
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet (see attsvm.svm.att_svm_constraints), got {type(cs).__name__}")


# ----------------------------------------------------------------------------- public solvers
def solve_nuclear(cs: ConstraintSet, options: NuclearOptions | None = None, **overrides: Any) -> RawSolution:
    """Att-SVM* (docs/spec.md §3): ``min ‖W‖_*`` subject to the constraint set ``cs``.

    Parameters
    ----------
    cs : ConstraintSet
        Inequality rows ``a_itᵀ W z_i ≥ b_it`` and equality rows ``= b_it`` (``svm/_base.py``).
    tol : float
        Relative duality gap ``(‖W‖_* − D)/‖W‖_*`` at which to stop, where ``D`` is the dual bound
        ``bᵀλ / max(1, ‖𝒜*(λ)‖₂)``.
    max_iter : int
        Outer augmented-Lagrangian iterations (each a warm-started L-BFGS solve).
    seed : int
        Seed of the small perturbation that breaks the symmetry of the factorisation.

    Returns
    -------
    RawSolution
        ``W`` (d, d) exactly feasible up to round-off, ``dual`` (n, T) the multipliers λ, status
        ``"optimal"`` (gap ≤ tol), ``"optimal_inaccurate"`` (iteration limit, gap reported), or
        ``"infeasible"`` with the certificate of docs/spec.md §3 in ``dual``. ``info`` holds ``objective``,
        ``dual_objective``, ``relative_gap``, ``violation``, ``rank_reduced`` (r_a, r_z) and timings.

    See the module docstring for the method (augmented Lagrangian + Burer–Monteiro + L-BFGS on the
    reduced problem) and why it is used instead of cvxpy.
    """
    _check_cs(cs)
    opt = _options(options, overrides, "solve_nuclear")
    tol, max_iter, seed = opt.tol, opt.max_iter, opt.seed
    t0 = time.perf_counter()
    reduction = reduce(cs)
    red = _reduce(reduction)
    triv = _trivial(cs, reduction, red, t0, "alm-burer-monteiro")
    if triv is not None:
        return triv
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    # start near the rank that typical optima have (~√K/2 here), never below _P0; grown as needed
    p = min(r_a, r_z, max(opt.p0, int(round(0.5 * np.sqrt(red.mask.sum())))))
    rng = np.random.default_rng(seed)
    K, Q = _initial_factors(red, p, rng)
    # small problems: a looser first subproblem before the first polish (fewer L-BFGS iterations;
    # the active-set corrections of the polish absorb the rougher guess at that size)
    small = bool(red.mask.sum() <= opt.small_k) if opt.path == "auto" else opt.path == "lean"
    if small:  # the fast path; it hands over after lean_max_failed_polish polishes that did not certify
        run = _ALMRun(tol=tol, max_iter=max_iter, grow_rank=True, lean=True, gtol0=opt.gtol0_small,
                      max_failed_polish=opt.lean_max_failed_polish if opt.path == "auto" else None)
        res = _alm(red, K, Q, opt, run, rng=rng)
    path = "lean"
    bmax = max(1.0, float(np.abs(red.b).max(initial=0.0)))
    cert = None
    if small and not res.converged and res.violation > 1e-6 * bmax:  # infeasible? then no second path
        cert = find_farkas(cs, red=reduction)
    if not small or (not res.converged and cert is None and opt.path == "auto"):
        # the reference path: scipy's L-BFGS-B (its Wolfe line search gives the polish steadier points on
        # badly scaled data, e.g. real attention heads), from the same start
        if small:
            logger.debug("lean path did not certify after %d outer iterations: rerunning with scipy's L-BFGS-B",
                         res.n_outer)
            rng = np.random.default_rng(seed)
            K, Q = _initial_factors(red, p, rng)
        lean_res = res if small else None
        res = _alm(red, K, Q, opt, _ALMRun(tol=tol, max_iter=max_iter, grow_rank=True, lean=False, gtol0=opt.gtol0),
                   rng=rng)
        path = "scipy" if not small else "lean, then scipy"
        if lean_res is not None and not res.converged and _better(lean_res, res, 1e-9 * float(
                max(1.0, np.abs(red.b).max(initial=0.0)))):
            res = lean_res
    info = {"solver": "alm-burer-monteiro", "rank_reduced": (r_a, r_z), "outer_iterations": res.n_outer,
            "inner_iterations": res.n_inner, "path": path, "time": None}
    if res.violation > 1e-6 * bmax:
        if cert is None:
            cert = find_farkas(cs, red=reduction)
        if cert is None:
            # feasibility does not depend on the norm: the Frobenius solver's dual ray is a candidate
            # too (docs/spec.md §3); like every certificate it is verified before it is used
            from .frobenius import solve_frobenius

            fro = solve_frobenius(cs)
            if fro.status == INFEASIBLE:
                cert = find_farkas(cs, candidates=(("frobenius dual ray", fro.dual),), red=reduction, lp=False)
        if cert is not None:
            info.update(reason=f"augmented Lagrangian stalled; Farkas certificate from the {cert.source}",
                        certificate_source=cert.source, time=time.perf_counter() - t0)
            return RawSolution(None, cert.lam, INFEASIBLE, res.n_outer, info)
    M = _make_feasible(red, res.K @ res.Q.T) if res.M is None else res.M  # (already made feasible)
    W = reduction.lift_W(M)
    # (a gap ≤ tol counts only for a feasible primal: an infeasible one can have a negative gap)
    feasible = res.violation <= 1e-9 * max(1.0, float(np.abs(red.b).max(initial=0.0)))
    status = OPTIMAL if (res.converged or (res.gap <= tol and feasible)) else OPTIMAL_INACCURATE
    if status != "optimal":
        warnings.warn(f"solve_nuclear stopped after {res.n_outer} outer iterations with relative gap "
                      f"{res.gap:.2e} > tol={tol:.1e} (violation {res.violation:.1e})", RuntimeWarning,
                      stacklevel=2)
    objective = res.primal if res.M is not None else _nuclear(M)
    info.update(objective=objective, dual_objective=res.dual, relative_gap=res.gap,
                violation=cs.violation(W), time=time.perf_counter() - t0)
    return RawSolution(W, reduction.lift_dual(_lift_dual(red, res.lam)), status, res.n_outer, info)


def solve_nuclear_rank(cs: ConstraintSet, *, rank: int, options: NuclearOptions | None = None, restarts: int = 3,
                       convex: RawSolution | None = None, **overrides: Any) -> RawSolution:
    """Rank-constrained Att-SVM* (docs/spec.md §3): ``min ½(‖K‖_F² + ‖Q‖_F²)`` s.t. the constraints on ``W = KQᵀ``.

    ``K, Q`` have ``rank`` columns (so ``rank(W) ≤ rank``). The problem is non-convex: we run the
    augmented Lagrangian of :func:`solve_nuclear` from ``restarts`` seeded random starts (the first
    one the truncated SVD of the convex solution) and keep the best feasible result. When ``rank``
    is at least the rank of the convex nuclear solution, that solution is feasible for this problem
    and the result equals the convex optimum; for smaller ranks the returned point is the best
    found, with **no guarantee of global optimality**.

    Returns a :class:`RawSolution` whose ``info`` reports ``objective`` (½(‖K‖²+‖Q‖²) at the returned
    balanced factors, = ‖W‖_*), ``convex_objective``, ``reached_convex_optimum`` (relative difference
    ≤ :data:`CONVEX_OPT_RTOL`), ``violation``, ``rank`` and ``K``, ``Q`` (d, rank). ``dual`` holds the
    augmented-Lagrangian multipliers (KKT multipliers of the factored problem, not a convex
    certificate unless the convex optimum was reached).
    """
    _check_cs(cs)
    rank = check_positive_int(rank, "rank")
    if options is None and "tol" not in overrides:
        overrides = dict(overrides, tol=RANK_GAP_TOL)
    opt = _options(options, overrides, "solve_nuclear_rank")
    tol, max_iter, seed = opt.tol, opt.max_iter, opt.seed
    restarts = check_positive_int(restarts, "restarts")
    t0 = time.perf_counter()
    if convex is None:
        convex = solve_nuclear(cs, replace(opt, tol=min(tol, NUCLEAR_GAP_TOL)))
    if convex.status == INFEASIBLE:
        info = dict(convex.info, rank=rank, reached_convex_optimum=False, convex_objective=None,
                    objective=None, solver="alm-burer-monteiro-rank")
        return RawSolution(None, convex.dual, INFEASIBLE, 0, info)
    assert convex.W is not None
    f_convex = float(convex.info["objective"])
    reduction = reduce(cs)
    red = _reduce(reduction)
    r_a, r_z = red.A.shape[2], red.Z.shape[1]
    d = cs.d
    p = min(rank, r_a, r_z)
    rng = np.random.default_rng(seed)
    M_cvx = reduction.reduce_W(convex.W)
    starts: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = []
    Kc, Qc = balanced_factors(M_cvx, rank=p)
    starts.append((Kc, Qc))
    for _ in range(restarts - 1):
        K0, Q0 = _initial_factors(red, p, rng, noise=0.3)
        starts.append((K0, Q0))
    best: tuple[float, float, _ALMResult] | None = None
    total_outer = 0
    start_objectives: list[float] = []
    # multipliers of the scaled rows: a good first guess
    lam_cvx = reduction.reduce_dual(convex.dual) * red.scale * red.mask
    scale_b = max(1.0, float(np.abs(red.b).max(initial=0.0)))
    for K0, Q0 in starts:
        res = _alm(red, K0, Q0, opt, _ALMRun(tol=tol, max_iter=max_iter, certify=False,
                                             lean=bool(red.mask.sum() <= opt.small_k)), lam=lam_cvx)
        total_outer += res.n_outer
        M = res.K @ res.Q.T
        Mf = _rescale_only(red, M)
        obj = _nuclear(Mf)
        viol = red.violation(red.apply(Mf))
        start_objectives.append(obj)
        key = (viol > 1e-8 * scale_b, obj)
        if best is None or key < (best[1] > 1e-8 * scale_b, best[0]):
            best = (obj, viol, res)
    assert best is not None
    obj, viol, res = best
    M = _rescale_only(red, res.K @ res.Q.T)
    W = reduction.lift_W(M)
    K, Q = balanced_factors(W, rank=rank)
    if K.shape[1] < rank:  # d < rank: pad with zero columns
        K = np.hstack([K, np.zeros((d, rank - K.shape[1]))])
        Q = np.hstack([Q, np.zeros((d, rank - Q.shape[1]))])
    rel = (obj - f_convex) / max(f_convex, 1e-300)
    reached = bool(abs(rel) <= CONVEX_OPT_RTOL)
    violation = cs.violation(W)
    feasible = relative_violation(cs, W) <= 1e-8
    status = OPTIMAL if reached else (OPTIMAL_INACCURATE if feasible else MAX_ITER)
    info = {"solver": "alm-burer-monteiro-rank", "rank": rank, "objective": obj, "convex_objective": f_convex,
            "relative_excess": rel, "reached_convex_optimum": reached, "violation": violation,
            "convex_rank_reduced": (r_a, r_z), "restarts": restarts, "K": K, "Q": Q,
            "start_objectives": start_objectives,
            "global_guarantee": reached,
            "time": time.perf_counter() - t0}
    return RawSolution(W, reduction.lift_dual(_lift_dual(red, res.lam)), status, total_outer, info)


def _rescale_only(red: _Reduced, M: NDArray[np.float64]) -> NDArray[np.float64]:
    """Feasibility repair that keeps the rank of M: for homogeneous equalities, rescaling only."""
    if red.eq.any() and np.any(red.eq & (red.b != 0)):
        return M  # a correction would change the rank; report the violation as is
    m = red.apply(M)
    pos = red.ineq & (red.b > 0)
    if pos.any() and np.all(m[pos] > 0):
        return M * float(np.max(red.b[pos] / m[pos]))
    return M
