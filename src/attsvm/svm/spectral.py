"""The spectral-norm attention SVM (docs/spec.md §3): ``min ‖W‖₂ s.t. a_kᵀ W z_k (≥ | =) b_k``.

``‖W‖₂`` is the largest singular value. The dual is ``max bᵀλ s.t. ‖Σ_k λ_k a_k z_kᵀ‖_* ≤ 1`` (λ ≥ 0 on the
inequality rows, free on equality rows): the nuclear norm is the dual norm of the spectral norm.

Method (and why)
----------------
1. Reduction (:mod:`.reduction`): rows normalised, ``W = U M Vᵀ`` with U spanning {a_k} and V spanning
   {z_i}, right-hand sides O(1). The spectral norm is unitarily invariant and projecting W onto these spans
   keeps every margin and cannot raise ‖W‖₂, so M (r_a × r_z) carries the whole problem. Rows repeated
   exactly within a sequence (duplicate tokens) are kept once; the copies get multiplier 0.
2. A strictly feasible start: the Frobenius solution (:mod:`.frobenius`, exact and fast) of the rows with the
   inequality right-hand sides raised. Feasibility does not depend on the norm, so when the rows have no
   feasible point the Frobenius solver's Farkas ray is handed to the estimator, which verifies it.
3. The semidefinite form ``min t s.t. S = [[t I, M], [Mᵀ, t I]] ⪰ 0, 𝒜(M) − s = b, s ≥ 0`` (N = r_a + r_z), whose
   dual is ``max bᵀλ s.t. Z ⪰ 0, tr Z = 1, 2 Z₁₂ = −𝒜*(λ), λ ≥ 0`` (so ‖𝒜*(λ)‖_* ≤ 1), is solved by an
   infeasible primal–dual interior point: Mehrotra's predictor–corrector with the Nesterov–Todd scaling W of
   (S, Z), as a symmetric-cone solver does, but never with a dense Newton matrix over the r_a·r_z entries of M.
   Eliminating (t, M) leaves the K × K system ``(𝒜 H⁻¹ 𝒜* + diag(s/λ)) Δλ = r`` with
   ``H = 𝓛*(W⁻¹ 𝓛(·) W⁻¹)``; writing ``W⁻¹ = [[P, Q], [Qᵀ, R]]``, ``H_MM(Δ) = 2(PΔR + QΔᵀQ)``, and in the coordinates
   ``Δ = T_a Δ̃ T_zᵀ`` (``T_a = P^{-1/2} U_K``, ``T_z = R^{-1/2} V_K`` from the SVD ``U_K κ V_Kᵀ`` of
   ``P^{-1/2} Q R^{-1/2}``) it couples only the entries (i, j) and (j, i) of Δ̃: its inverse costs O(r_a r_z) after
   O(N³) set-up. Every row of a sequence shares its query z_i, so the K × K matrix is built sequence pair by
   sequence pair, O(n² T r (T + r)) rather than O(K² r_a r_z) (:func:`_schur`). Each direction is refined
   on the unreduced Newton equations (the Woodbury-type elimination loses digits once W is ill-conditioned).
4. Certification at every iteration: the primal is made exactly feasible (a least-norm correction on
   equality rows, then a rescaling), the multipliers give the dual bound ``bᵀλ / max(1, ‖𝒜*(λ)‖_*)``, and the
   loop stops once the relative gap between the two is a quarter of ``tol``. Where it stops at its round-off
   floor above that (the gap is about ν·μ with ν = N + K, large when K is), the problem is solved again on the
   rows that carry the multipliers, whose optimum is the same and whose ν is small (:func:`_polish_dual`). The
   answer is rechecked by :mod:`.certificate`, which judges every backend alike.

Why not cvxpy: ``sigma_max`` becomes a PSD cone of order N whose scaling block in an interior-point KKT
system is dense of order N(N+1)/2; ``benchmarks/bench_spectral.py`` compares the two in one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from ._base import ConstraintSet, RawSolution
from .reduction import reduce
from .status import INFEASIBLE, MAX_ITER, OPTIMAL, OPTIMAL_INACCURATE

__all__ = ["SpectralOptions", "solve_spectral"]

Vec = NDArray[np.float64]


@dataclass(frozen=True)
class SpectralOptions:
    """Options of :func:`solve_spectral`.

    tol : the relative duality gap (of the certified pair: exactly feasible primal, scaled dual) that the result
        must reach for status "optimal"; the iteration stops at a quarter of it.
    max_iter : interior-point iterations.
    step_fraction : fraction of the distance to the boundary of the cones that a step covers.
    refine : the most rounds of iterative refinement of each Newton direction (they stop once the residual of the
        unreduced equations stops halving).
    stall : the iteration stops when the best certified gap (once below 1e-4) has not halved in this many
        iterations.
    """

    tol: float = 1e-9
    max_iter: int = 100
    step_fraction: float = 0.99
    refine: int = 8
    stall: int = 6

    def __post_init__(self) -> None:
        if isinstance(self.tol, bool) or not (isinstance(self.tol, (int, float)) and 0 < self.tol < np.inf):
            raise ValueError(f"tol must be a finite number > 0, got {self.tol!r}")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {self.max_iter!r}")


class _Rows:
    """The reduced rows in the per-sequence layout of :class:`ConstraintSet`: features A (n, T, r_a) (0 off the
    rows), queries Z (n, r_z), right-hand sides b, the kept rows ``on`` and their flat indices ``idx``."""

    def __init__(self, A: Vec, Z: Vec, on: NDArray[np.bool_], b: Vec, eq: NDArray[np.bool_]) -> None:
        self.A, self.Z, self.on, self.b = A, Z, on, b
        self.eq = eq & on
        self.ineq = on & ~eq
        self.idx = np.flatnonzero(on.ravel())
        self.K = int(self.idx.size)
        self.n, self.T, self.ra = A.shape
        self.rz = Z.shape[1]

    def apply(self, M: Vec) -> Vec:
        """``a_kᵀ M z_k`` (n, T), 0 off the rows."""
        return np.matmul(self.A, (self.Z @ M.T)[:, :, None])[:, :, 0] * self.on

    def adjoint(self, lam: Vec) -> Vec:
        """``Σ_k λ_k a_k z_kᵀ`` (r_a, r_z)."""
        return np.matmul(lam[:, None, :], self.A)[:, 0, :].T @ self.Z


def _dedupe(A: Vec, on: NDArray[np.bool_], b: Vec, eq: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``on`` without the rows repeated exactly (same sequence, feature, right-hand side and kind)."""
    ii, tt = np.nonzero(on)
    if ii.size < 2:
        return on
    key = np.column_stack([ii, A[ii, tt], b[ii, tt], eq[ii, tt]])
    _, first = np.unique(key, axis=0, return_index=True)
    if first.size == ii.size:
        return on
    keep = np.zeros(ii.size, dtype=bool)
    keep[first] = True
    out = on.copy()
    out[ii[~keep], tt[~keep]] = False
    return out


def _schur(rows: _Rows, hs: _NT, At: Vec, Zt: Vec) -> Vec:
    """``𝒜 H_MM⁻¹ 𝒜*`` over the kept rows (K, K), for ``H_MM⁻¹B = T_a(α∘B̃ + β∘B̃ᵀ)T_zᵀ``, ``B̃ = T_aᵀ B T_z``, from the
    transformed rows ``At = A T_a`` and ``Zt = Z T_z`` (module doc, step 3). Rows of one sequence share z̃_s, so
    block (s, u) is ``Ã_s diag(Γ_su) Ã_uᵀ + Ã_s diag(z̃_u) β diag(z̃_s) Ã_uᵀ`` with ``Γ_su,i = Σ_j α_ij z̃_sj z̃_uj``:
    O(n² T r (T + r)) in all, not O(K² r_a r_z)."""
    n, T, ra = At.shape
    r = hs.r
    alpha, beta = hs.alpha, hs.beta
    Gam = np.matmul(Zt[:, None, :] * alpha[None], Zt.T).transpose(0, 2, 1)  # Γ[s, u, i]
    AtT = np.ascontiguousarray(At.transpose(0, 2, 1))  # (n, r_a, T)
    Ar = At[:, :, :r]
    out = np.empty((n, T, n, T))
    for s in range(n):
        X = At[s][None, :, :] * Gam[s][:, None, :]  # (n_u, T, r_a)
        if r:
            C = (Ar[s][None, :, :] * Zt[:, None, :r]).reshape(n * T, r) @ beta
            X[:, :, :r] += C.reshape(n, T, r) * Zt[s, :r]
        out[s] = np.matmul(X, AtT).transpose(1, 0, 2)  # (T, n_u, T)
    G = out.reshape(n * T, n * T)
    return G[np.ix_(rows.idx, rows.idx)]


class _NT:
    """The Nesterov–Todd scaling of (S, Z) and the explicit inverse of ``H = 𝓛*(W⁻¹ 𝓛(·) W⁻¹)`` on (t, M)
    (module doc, step 3). ``R`` satisfies ``R⁻¹ S R⁻ᵀ = Rᵀ Z R = Λ`` (diagonal ``lam``); ``W⁻¹ = R⁻ᵀR⁻¹``."""

    def __init__(self, S: Vec, Z: Vec, ra: int, rz: int) -> None:
        Ls = np.linalg.cholesky(S)
        Lz = np.linalg.cholesky(Z)
        Uw, lam, Vwt = np.linalg.svd(Lz.T @ Ls)
        if not lam[-1] > 0:
            raise np.linalg.LinAlgError("singular scaling")
        self.lam = lam
        self.R = (Ls @ Vwt.T) / np.sqrt(lam)
        self.Rinv = (Uw.T @ Lz.T) / np.sqrt(lam)[:, None]
        Winv = self.Rinv.T @ self.Rinv
        self.Winv = Winv
        # W⁻¹ = [[P, Q], [Qᵀ, R]] = BᵀB with B = R⁻¹ = [B_a, B_z]; from the thin SVDs B_a = U_a S_a V_aᵀ and
        # B_z = U_z S_z V_zᵀ, P^{-1/2} = V_a S_a⁻¹ V_aᵀ, R^{-1/2} = V_z S_z⁻¹ V_zᵀ and
        # K = P^{-1/2}QR^{-1/2} = V_a (U_aᵀU_z) V_zᵀ: κ are the cosines of the principal angles between range(B_a)
        # and range(B_z), and 1 − κ² their squared sines, computed as such (1 − κ² by subtraction would lose
        # every digit as κ → 1 near the optimum)
        Ua, Sa, Vat = np.linalg.svd(self.Rinv[:, :ra], full_matrices=False)
        Uz, Sz, Vzt = np.linalg.svd(self.Rinv[:, ra:], full_matrices=False)
        if not (Sa[-1] > 0 and Sz[-1] > 0):
            raise np.linalg.LinAlgError("singular scaling block")
        Uc, kap, Vct = np.linalg.svd(Ua.T @ Uz, full_matrices=True)
        r = kap.size
        kap = np.minimum(kap, 1.0)
        self.Ta = (Vat.T / Sa) @ Uc
        self.Tz = (Vzt.T / Sz) @ Vct.T
        self.r = r
        sines2 = np.sum((Uz @ Vct[:r].T - Ua @ (Uc[:, :r] * kap)) ** 2, axis=0)  # 1 − κ², (r,)
        # in these coordinates H_MM(Δ̃) = 2(Δ̃ + κΔ̃ᵀκ): 2 × 2 blocks [[1, κ_iκ_j], [κ_iκ_j, 1]] on (Δ̃_ij, Δ̃_ji), with
        # determinant 1 − κ_i²κ_j² = s_i + s_j − s_i s_j (s = 1 − κ²)
        kk = kap[:, None] * kap[None, :]
        den = sines2[:, None] + sines2[None, :] - sines2[:, None] * sines2[None, :]
        if not np.all(den > 0):
            raise np.linalg.LinAlgError("singular scaling block")
        # on the symmetric part of (Δ̃_ij, Δ̃_ji) the inverse is p = ½/(1 + κ_iκ_j), on the skew part
        # q = ½/(1 − κ_iκ_j) = ½(1 + κ_iκ_j)/den; :meth:`hinv_mm` applies them apart (Ψ(X) = α∘X + β∘Xᵀ with
        # α = (p + q)/2, β = (p − q)/2 would lose log10(q) digits on the symmetric part near the end, where κ → 1)
        self.p = 0.5 / (1.0 + kk)
        self.q = 0.5 * (1.0 + kk) / den
        alpha = np.full((ra, rz), 0.5)
        alpha[:r, :r] = 0.5 * (self.p + self.q)
        self.alpha = alpha
        self.beta = 0.5 * (self.p - self.q)
        # the t column of H: h = 2(W⁻²)₁₂; w = H_MM⁻¹h and the Schur complement c = h_tt − ⟨h, w⟩ (block
        # elimination), computed as the sum of squares c = ⟨X, W⁻¹XW⁻¹⟩ = ‖R⁻¹XR⁻ᵀ‖_F² at X = 𝓛(1, −w)
        # (no cancellation between h_tt and ⟨h, w⟩, both of order 1/μ near the end)
        h = 2.0 * (Winv @ Winv)[:ra, ra:]
        self.w = self.hinv_mm(h)
        self.c = float(np.sum((self.Rinv @ _lift(1.0, -self.w) @ self.Rinv.T) ** 2))
        if not self.c > 0:
            raise np.linalg.LinAlgError("singular scaling (t)")
        self.ra = ra

    def hinv_mm(self, B: Vec) -> Vec:
        """``H_MM⁻¹ B``."""
        X = self.Ta.T @ B @ self.Tz
        r = self.r
        out = 0.5 * X  # (outside the square block)
        Xr = X[:r, :r]
        out[:r, :r] = self.p * (0.5 * (Xr + Xr.T)) + self.q * (0.5 * (Xr - Xr.T))
        return self.Ta @ out @ self.Tz.T

    def hinv(self, rho_t: float, rho_M: Vec) -> tuple[float, Vec]:
        """``H⁻¹ (ρ_t, ρ_M)``."""
        y = self.hinv_mm(rho_M)
        dt = (rho_t - float(np.vdot(self.w, rho_M))) / self.c
        return dt, y - self.w * dt

    def hfwd(self, dt: float, dM: Vec) -> tuple[float, Vec]:
        """``H (Δt, ΔM) = 𝓛*(W⁻¹ 𝓛(Δt, ΔM) W⁻¹)``."""
        X = self.Winv @ _lift(dt, dM) @ self.Winv
        return float(np.trace(X)), 2.0 * X[: self.ra, self.ra :]


def _lift(dt: float, dM: Vec) -> Vec:
    """``𝓛(Δt, ΔM) = [[Δt I, ΔM], [ΔMᵀ, Δt I]]``."""
    ra, rz = dM.shape
    N = ra + rz
    out = np.zeros((N, N))
    out[:ra, ra:] = dM
    out[ra:, :ra] = dM.T
    out[np.arange(N), np.arange(N)] = dt
    return out


def _max_step_psd(lam: Vec, D: Vec) -> float:
    """Largest α (capped at 1e30) with ``Λ + αD ⪰ 0`` (Λ diagonal and positive, D symmetric)."""
    s = 1.0 / np.sqrt(lam)
    lo = float(np.linalg.eigvalsh(D * s[:, None] * s[None, :])[0])
    return -1.0 / lo if lo < 0 else 1e30


def _max_step_vec(x: Vec, dx: Vec) -> float:
    """Largest α (capped at 1e30) with ``x + α dx ≥ 0`` (x > 0)."""
    neg = dx < 0
    if not neg.any():
        return 1e30
    return float(np.min(-x[neg] / dx[neg]))


def _feasible(rows: _Rows, M: Vec) -> Vec | None:
    """An exactly feasible primal near M: a least-norm correction on the equality rows, then a rescaling that
    lifts every inequality row with b > 0 to its right-hand side; None when that does not succeed."""
    if rows.eq.any():
        k = np.flatnonzero(rows.eq.ravel())
        F = rows.A.reshape(-1, rows.ra)[k]
        Zs = rows.Z[k // rows.T]
        G = (F @ F.T) * (Zs @ Zs.T)
        resid = rows.b.ravel()[k] - rows.apply(M).ravel()[k]
        mu = np.linalg.lstsq(G, resid, rcond=1e-13)[0]
        lam = np.zeros(rows.n * rows.T)
        lam[k] = mu
        M = M + rows.adjoint(lam.reshape(rows.n, rows.T))
    m = rows.apply(M)
    pos = rows.ineq & (rows.b > 0)
    if pos.any() and not np.any(rows.eq & (rows.b != 0)):
        if not np.all(m[pos] > 0):
            return None
        c = float(np.max(rows.b[pos] / m[pos]))
        if c > 1.0:
            M, m = M * c, m * c
    bmax = max(1.0, float(np.abs(rows.b).max(initial=0.0)))
    viol = np.where(rows.ineq, np.maximum(rows.b - m, 0.0), np.where(rows.eq, np.abs(m - rows.b), 0.0))
    return M if viol.max(initial=0.0) <= 1e-12 * bmax else None


def _certify(rows: _Rows, M: Vec, lam: Vec) -> tuple[float, float, float, Vec | None]:
    """(relative gap, primal value, dual bound, the feasible primal or None) of the pair (M, λ)."""
    Mf = _feasible(rows, M)
    lam = np.where(rows.ineq, np.maximum(lam, 0.0), np.where(rows.eq, lam, 0.0))
    nuc = float(np.linalg.svd(rows.adjoint(lam), compute_uv=False).sum())
    dual = float((rows.b * lam).sum()) / max(1.0, nuc)
    if Mf is None:
        return np.inf, np.inf, dual, None
    primal = float(np.linalg.norm(Mf, 2))
    den = abs(primal) + abs(dual)
    return (abs(primal - dual) / den if den > 0 else 0.0), primal, dual, Mf


def _factor(G: Vec) -> tuple[str, Any]:
    """A factorisation of the K × K matrix G: Cholesky, or (where round-off has made G numerically indefinite, near
    the end) LU with partial pivoting, which stays backward stable there."""
    try:
        return "chol", scipy.linalg.cho_factor(G, lower=True, check_finite=False)
    except (np.linalg.LinAlgError, ValueError):
        return "lu", scipy.linalg.lu_factor(G, check_finite=False)


def _solve(fac: tuple[str, Any], rhs: Vec) -> Vec:
    kind, f = fac
    if kind == "chol":
        return scipy.linalg.cho_solve(f, rhs, check_finite=False)
    return scipy.linalg.lu_solve(f, rhs, check_finite=False)


Direction = tuple[float, Vec, Vec, Vec, Vec, Vec]  # (Δt, ΔM, Δs, Δλ, ΔS, ΔZ)


class _Iterate:
    """One iterate (t, M, s, λ, Z) of :func:`_ipm` with its scaling, residuals and factorised K × K system."""

    def __init__(self, rows: _Rows, opt: SpectralOptions, t: float, M: Vec, s: Vec, lam: Vec, Z: Vec) -> None:
        self.rows, self.opt = rows, opt
        self.t, self.M, self.s, self.lam, self.Z = t, M, s, lam, Z
        ra, rz, K = rows.ra, rows.rz, rows.K
        ineq, flat = rows.ineq, rows.idx
        self.N = N = ra + rz
        self.nu = N + int(ineq.sum())
        self.S = _lift(t, M)
        self.nt = nt = _NT(self.S, Z, ra, rz)  # (LinAlgError: the caller stops)
        self.mu = (float(np.vdot(self.S, Z)) + float((s * lam)[ineq].sum())) / self.nu
        self.rp = rows.apply(M) - rows.b - s  # primal residual (s = 0 on equality rows)
        self.Rd_t = 1.0 - float(np.trace(Z))  # dual residual c − 𝓛*(Z) − F̂ᵀλ
        self.Rd_M = -2.0 * Z[:ra, ra:] - rows.adjoint(lam)
        G = _schur(rows, nt, rows.A @ nt.Ta, rows.Z @ nt.Tz)
        Fw = rows.apply(nt.w).ravel()[flat]
        G += np.outer(Fw, Fw) / nt.c
        self.lam_safe = np.where(ineq, lam, 1.0)
        G[np.arange(K), np.arange(K)] += np.where(ineq, s / self.lam_safe, 0.0).ravel()[flat]
        self.fac = _factor(G)

    def newton(self, rho_t: float, rho_M: Vec, rc: Vec, rp: Vec) -> tuple[float, Vec, Vec, Vec]:
        """(Δt, ΔM, Δs, Δλ) with ``HΔx − F̂ᵀΔλ = ρ``, ``λΔs + sΔλ = rc``, ``𝒜ΔM − Δs = −r_p`` (the K × K system)."""
        rows, nt, ineq = self.rows, self.nt, self.rows.ineq
        _, hM = nt.hinv(rho_t, rho_M)
        rhs = (np.where(ineq, rc / self.lam_safe, 0.0) - rp - rows.apply(hM)).ravel()[rows.idx]
        dl = np.zeros(rows.n * rows.T)
        dl[rows.idx] = _solve(self.fac, rhs)
        dlam = dl.reshape(rows.n, rows.T)
        dt, dM = nt.hinv(rho_t, rho_M + rows.adjoint(dlam))
        return dt, dM, np.where(ineq, rows.apply(dM) + rp, 0.0), dlam

    def direction(self, rc_sdp: Vec, rc: Vec) -> Direction:
        """The direction for the scaled complementarity right-hand side ``rc_sdp`` (cone) and ``rc`` (rows):
        ``ΔZ = Z_c − W⁻¹ΔS W⁻¹`` with ``Z_c = R⁻ᵀ(Λ ⋄ rc_sdp)R⁻¹``, and (Δx, Δλ, Δs) from ``HΔx − F̂ᵀΔλ = 𝓛*(Z_c) − R_d``
        and the rows' equations, refined on the unreduced system."""
        rows, nt, ineq, ra = self.rows, self.nt, self.rows.ineq, self.rows.ra
        Xc = 2.0 * rc_sdp / (nt.lam[:, None] + nt.lam[None, :])  # Λ ⋄ rc_sdp
        Zc = nt.Rinv.T @ Xc @ nt.Rinv
        rho_t = float(np.trace(Zc)) - self.Rd_t
        rho_M = 2.0 * Zc[:ra, ra:] - self.Rd_M
        dt, dM, ds, dlam = self.newton(rho_t, rho_M, rc, self.rp)
        scale = max(abs(rho_t), float(np.abs(rho_M).max()), float(np.abs(rc).max()), float(np.abs(self.rp).max()))
        last = np.inf
        for _ in range(self.opt.refine):  # until the residual stops halving or reaches round-off
            Ht, HM = nt.hfwd(dt, dM)
            e_t, e_M = rho_t - Ht, rho_M - HM + rows.adjoint(dlam)
            e_c = np.where(ineq, rc - self.lam * ds - self.s * dlam, 0.0)
            e_p = np.where(rows.on, rows.apply(dM) - ds + self.rp, 0.0)
            res = max(abs(e_t), float(np.abs(e_M).max()), float(np.abs(e_c).max()), float(np.abs(e_p).max()))
            if not res < 0.5 * last or res <= 1e-15 * scale:
                break
            last = res
            c_t, c_M, c_s, c_l = self.newton(e_t, e_M, e_c, e_p)
            dt, dM, ds, dlam = dt + c_t, dM + c_M, ds + c_s, dlam + c_l
        dS = _lift(dt, dM)
        dZ = Zc - nt.Winv @ dS @ nt.Winv
        return dt, dM, ds, dlam, dS, 0.5 * (dZ + dZ.T)

    def max_step(self, d: Direction) -> float:
        """The largest step along d that keeps S, Z ⪰ 0 and s, λ ≥ 0 (capped at 1e30)."""
        _, _, ds, dlam, dS, dZ = d
        nt, ineq = self.nt, self.rows.ineq
        return min(
            _max_step_psd(nt.lam, nt.Rinv @ dS @ nt.Rinv.T),
            _max_step_psd(nt.lam, nt.R.T @ dZ @ nt.R),
            _max_step_vec(self.s[ineq], ds[ineq]),
            _max_step_vec(self.lam[ineq], dlam[ineq]),
        )

    def step(self) -> tuple[float, Vec, Vec, Vec, Vec]:
        """Mehrotra's predictor–corrector: the affine step gives σ = (μ_aff/μ)³, the corrector adds the
        second-order terms; returns the next (t, M, s, λ, Z)."""
        nt, ineq, s, lam, mu = self.nt, self.rows.ineq, self.s, self.lam, self.mu
        L2 = np.diag(nt.lam**2)
        d = self.direction(-L2, np.where(ineq, -s * lam, 0.0))
        a = min(1.0, self.max_step(d))
        _, _, ds, dlam, dS, dZ = d
        gap_aff = float(np.vdot(self.S + a * dS, self.Z + a * dZ)) + float(
            ((s + a * ds) * (lam + a * dlam))[ineq].sum()
        )
        sigma = min(1.0, max(0.0, gap_aff / self.nu / mu)) ** 3
        dsa, dza = nt.Rinv @ dS @ nt.Rinv.T, nt.R.T @ dZ @ nt.R
        rc_sdp = sigma * mu * np.eye(self.N) - L2 - 0.5 * (dsa @ dza + dza @ dsa)
        rc = np.where(ineq, sigma * mu - s * lam - ds * dlam, 0.0)
        d = self.direction(rc_sdp, rc)
        a = min(1.0, self.opt.step_fraction * self.max_step(d))
        dt, dM, ds, dlam, dS, dZ = d
        Z = self.Z + a * dZ
        return (
            self.t + a * dt,
            self.M + a * dM,
            np.where(ineq, s + a * ds, 0.0),
            np.where(self.rows.on, lam + a * dlam, 0.0),
            0.5 * (Z + Z.T),
        )


def _ipm(rows: _Rows, opt: SpectralOptions, M0: Vec) -> dict[str, Any]:
    """The interior point of the module doc (step 3) on the reduced rows from the primal point M0; a dict of
    the best certified point."""
    N = rows.ra + rows.rz
    ineq, b = rows.ineq, rows.b
    bmax = max(1.0, float(np.abs(b).max(initial=0.0)))
    smax = float(np.linalg.norm(M0, 2))
    t = 1.5 * smax if smax > 0 else 1.0
    M, Z = M0, np.eye(N) / N
    s = np.where(ineq, np.maximum(rows.apply(M) - b, 1e-3 * bmax), 0.0)
    lam = np.where(ineq, (t / N) / np.where(ineq, s, 1.0), 0.0)
    rel, primal, dual, Mf = _certify(rows, M, lam)
    best: dict[str, Any] = {"gap": rel, "M": Mf, "lam": lam, "primal": primal, "dual": dual, "at": 0}
    target = 0.25 * opt.tol
    it = 0
    for it in range(1, opt.max_iter + 1):
        try:
            t, M, s, lam, Z = _Iterate(rows, opt, t, M, s, lam, Z).step()
        except np.linalg.LinAlgError:  # the scaling or the Newton system broke down (round-off floor)
            break
        rel, primal, dual, Mf = _certify(rows, M, lam)
        if rel < best["gap"]:
            if rel < 0.5 * best["gap"]:
                best["at"] = it
            best.update(gap=rel, M=Mf, lam=lam.copy(), primal=primal, dual=dual)
        # (stalled: the round-off floor of the end game, where the best gap has not halved in opt.stall steps)
        if best["gap"] <= target or (it - best["at"] >= opt.stall and best["gap"] < 1e-4):
            break
    best["iterations"] = it
    return best


def _polish_dual(rows: _Rows, opt: SpectralOptions, res: dict[str, Any]) -> dict[str, Any]:
    """Where the interior point stopped at its round-off floor above the target (the gap is about ν·μ with
    ν = N + (inequality rows), large when K is), solve the problem again on the rows that carry the multipliers
    (λ_k > 1e-6 max λ, or a slack below 1e-6): its optimum is the same, its ν is smaller, and its multipliers
    (0 on the other rows) are dual feasible for all rows. The primal stays the full solve's; the better
    certified pair is kept."""
    M, lam = res["M"], np.where(rows.ineq, np.maximum(res["lam"], 0.0), res["lam"])
    m = rows.apply(M)
    bmax = max(1.0, float(np.abs(rows.b).max(initial=0.0)))
    keep = rows.eq | (rows.ineq & ((lam > 1e-6 * float(lam.max(initial=0.0))) | (m - rows.b <= 1e-6 * bmax)))
    if not 0 < int(keep.sum()) < rows.K:
        return res
    sub = _Rows(rows.A * keep[..., None], rows.Z, keep, np.where(keep, rows.b, 0.0), rows.eq)
    part = _ipm(sub, opt, M)
    rel, primal, dual, Mf = _certify(rows, M, np.where(keep, part["lam"], 0.0))
    if rel < res["gap"]:
        return {**res, "gap": rel, "M": Mf, "lam": np.where(keep, part["lam"], 0.0), "primal": primal, "dual": dual,
                "iterations": res["iterations"] + part["iterations"]}  # fmt: skip
    return res


def _feasible_start(rows: _Rows) -> tuple[Vec | None, Vec | None]:
    """(M0, None): a primal point meeting every row, inequalities strictly where possible (the Frobenius solution
    of the rows with the inequality right-hand sides raised, then as they are); or (None, λ) with the Frobenius
    solver's Farkas ray of these rows when they have no feasible point."""
    from .frobenius import solve_frobenius

    bmax = max(1.0, float(np.abs(rows.b).max(initial=0.0)))
    ray = None
    for lift in (0.25, 0.0):
        rhs = np.where(rows.ineq, rows.b + lift * bmax, rows.b)
        raw = solve_frobenius(ConstraintSet._trusted(rows.A, rows.Z, rows.on, rhs, rows.eq))
        if raw.W is not None and raw.status != INFEASIBLE:
            return np.asarray(raw.W, dtype=np.float64), None
        if raw.status == INFEASIBLE:
            ray = raw.dual
    return None, ray


def solve_spectral(cs: ConstraintSet, options: SpectralOptions | None = None, **overrides: Any) -> RawSolution:
    """The spectral-norm attention SVM ``min ‖W‖₂ s.t. cs`` (docs/spec.md §3; module doc).

    Parameters
    ----------
    cs : ConstraintSet
        Inequality rows ``a_itᵀ W z_i ≥ b_it`` and equality rows ``= b_it``.
    options : SpectralOptions, optional
        Solver options; ``**overrides`` replaces fields of it (e.g. ``tol=1e-10, max_iter=50``).

    Returns
    -------
    RawSolution
        ``W`` (d, d_z) exactly feasible up to round-off and the multipliers λ (n, T), status "optimal" (certified
        relative gap ≤ ``tol``), "optimal_inaccurate" or "max_iter"; or "infeasible" with a candidate Farkas
        ray in ``dual`` (verified by the estimator). ``info`` holds the objective, the dual bound, the relative
        gap, the reduced shape and the time.
    """
    if not isinstance(cs, ConstraintSet):
        raise TypeError(f"cs must be a ConstraintSet, got {type(cs).__name__}")
    if options is not None and not isinstance(options, SpectralOptions):
        raise TypeError(f"options must be a SpectralOptions, got {type(options).__name__}")
    opt = replace(options or SpectralOptions(), **overrides)
    t0 = time.perf_counter()
    red = reduce(cs)
    work = red.problem
    info: dict[str, Any] = {"solver": "spectral-ipm"}
    if red.unattainable.any():  # 0 ≥ b > 0 on a zero row
        return RawSolution(None, red.zero_row_farkas(), INFEASIBLE, 0, info | {"reason": "zero feature row"})
    ra, rz = work.A.shape[2], work.Z.shape[1]
    if not work.mask.any() or ra == 0 or rz == 0:
        return RawSolution(np.zeros((cs.d, cs.Z.shape[1])), np.zeros(cs.mask.shape), OPTIMAL, 0, info)
    on = _dedupe(work.A, work.mask, work.rhs, work.equality)
    rows = _Rows(work.A * on[..., None], work.Z, on, np.where(on, work.rhs, 0.0), work.equality & on)
    M0, ray = _feasible_start(rows)
    if M0 is None:
        cand = np.zeros(cs.mask.shape) if ray is None else red.lift_farkas(np.asarray(ray))
        info.update(reason="no feasible point (Frobenius solver)", time=time.perf_counter() - t0)
        return RawSolution(None, cand, INFEASIBLE, 0, info)
    res = _ipm(rows, opt, M0)
    if res["M"] is not None and res["gap"] > 0.25 * opt.tol:
        res = _polish_dual(rows, opt, res)
    info.update(
        rank_reduced=(ra, rz),
        relative_gap=res["gap"],
        objective=res["primal"] * red.global_scale,
        dual_objective=res["dual"] * red.global_scale,
        time=time.perf_counter() - t0,
    )
    if res["M"] is None:  # (no feasible iterate: the start itself is feasible, so this is a numerical failure)
        M_out = M0
        status = OPTIMAL_INACCURATE
    else:
        M_out = res["M"]
        if res["gap"] <= opt.tol:
            status = OPTIMAL
        else:
            status = MAX_ITER if res["iterations"] >= opt.max_iter else OPTIMAL_INACCURATE
    lam = np.where(work.inequality, np.maximum(res["lam"], 0.0), res["lam"])
    return RawSolution(red.lift_W(M_out), red.lift_dual(lam, degree=1), status, res["iterations"], info)
