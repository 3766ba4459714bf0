"""A batched primal–dual interior-point method for many small nuclear-norm SVMs (docs/spec.md §3).

The reduced nuclear SVM of :mod:`.nuclear` (rows normalised, ``M`` of size r_a × r_z) is the
semidefinite program

    min ⟨C, X⟩ = ½(tr P₁ + tr P₂)   s.t.   X = [[P₁, M], [Mᵀ, P₂]] ⪰ 0,
                                          ⟨F_k, X⟩ = a_kᵀ M z_k ≥ b_k   (= on equality rows)

with ``C = ½ I`` and ``F_k = ½(u_k v_kᵀ + v_k u_kᵀ)``, ``u_k = (a_k, 0)``, ``v_k = (0, z_k)`` (the
variational form of ‖M‖_*). Its dual is ``max bᵀy s.t. Z = C − Σ_k y_k F_k ⪰ 0, y ≥ 0 on
inequalities``, i.e. ``‖Σ_k y_k a_k z_kᵀ‖₂ ≤ 1``: the dual of docs/spec.md §3, whose multipliers y are
the certificate's λ.

:func:`ipm_many` solves B instances of one shape (K rows, r_a, r_z) at once by the infeasible
primal–dual method with the HKM search direction and Mehrotra's predictor–corrector. Every step is
a batched NumPy/LAPACK call over the stack; an instance never depends on the others of its batch
(each has its own step lengths, centring and stopping test). The Schur complement of the HKM system,
``S_kl = tr(F_k X F_l Z⁻¹)``, needs no N × N products per row pair: F_k has rank 2, so

    4·S = G^X_{uv}ᵀ∘G^Z_{uv} + G^X_{uv}∘G^Z_{uv}ᵀ + G^X_{vv}∘G^Z_{uu} + G^X_{uu}∘G^Z_{vv}

with the K × K Gram matrices ``G^X_{uu} = A X₁₁ Aᵀ``, ``G^X_{uv} = A X₁₂ Zᵀ``, ``G^X_{vv} = Z X₂₂ Zᵀ``
(rows a_k, z_k) and the same for Z⁻¹: O(K²(r_a + r_z)) to form, then O(K³) to factorise, and
O(N³) (N = r_a + r_z) for the factors, inverses and step-length eigenvalues of X and Z per iteration.

With numba installed (the ``fast`` extra, and ``ATTSVM_COMPILED`` not 0: the switch of
:func:`attsvm.svm.batch.compiled`) the stack goes to :mod:`._sdp_compiled`, the same method compiled
one instance at a time (about 2× faster on svm-rank's instances, where NumPy's per-call cost and the
K × K elementwise work dominate the small programs). The NumPy route below is its reference: the two
follow the same iterates to round-off, so they agree iteration for iteration except where an instance
sits on a stopping threshold (a degenerate optimum at the round-off floor, or an infeasible instance's
multipliers near ``DIVERGED_Y``), and except on an exactly singular Schur complement, where the NumPy
route's LU may meet a zero pivot and the compiled Cholesky a tiny positive one (the batch removes
repeated rows first, the usual cause).

The interior point stops at a relative gap and infeasibility of ``tol``; the caller
(:mod:`.batch_nuclear`) makes the primal exactly feasible, certifies it with the certificate of
:mod:`.certificate` and sends every instance that does not certify to the one-at-a-time solver.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

__all__ = ["ipm_many"]

# fraction of the distance to the boundary of the cone that a step may cover
STEP_FRACTION = 0.95
# an instance whose merit (max of relative gap, primal and dual infeasibility) is below STALL_BELOW
# and has not halved in STALL_ITERS iterations stops there (round-off floor); its point is certified
STALL_BELOW = 1e-7
STALL_ITERS = 2
# an instance whose multipliers exceed this (in solver units, where the optimal ones are O(1) to
# O(‖W‖)) is taken as infeasible (its dual is unbounded) and leaves at once, unconverged
DIVERGED_Y = 1e12


def _sym(X: NDArray[np.float64]) -> NDArray[np.float64]:
    return 0.5 * (X + X.transpose(0, 2, 1))


def _guarded(
    fn: Callable[..., NDArray[np.float64]], *arrays: NDArray[np.float64], shape: tuple[int, ...] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """``fn`` over the stack, and which instances it succeeded on: when LAPACK refuses one instance
    (not positive definite, singular, eigenvalues that do not converge on a NaN), the others are
    computed one by one, so that it poisons no one. ``fn``'s result has ``shape`` (default: that of its
    last argument, as a factor of A or the solution for b); the refused instances get NaN there."""
    B = arrays[0].shape[0]
    try:
        return fn(*arrays), np.ones(B, dtype=bool)
    except np.linalg.LinAlgError:
        ok = np.ones(B, dtype=bool)
        out = np.full(arrays[-1].shape if shape is None else shape, np.nan)
        for i in range(B):
            try:
                out[i] = fn(*(a[i : i + 1] for a in arrays))[0]
            except np.linalg.LinAlgError:
                ok[i] = False
        return out, ok


def _apply(F: NDArray[np.float64], Zq: NDArray[np.float64], G: NDArray[np.float64]) -> NDArray[np.float64]:
    """``⟨F_k, G⟩`` for every row (G need not be symmetric): ``a_kᵀ sym(G)₁₂ z_k``."""
    r_a = F.shape[2]
    H = 0.5 * (G[:, :r_a, r_a:] + G[:, r_a:, :r_a].transpose(0, 2, 1))
    return np.einsum("pkr,pkr->pk", F @ H, Zq)


def _adjoint(F: NDArray[np.float64], Zq: NDArray[np.float64], v: NDArray[np.float64], N: int) -> NDArray[np.float64]:
    """``Σ_k v_k F_k`` = ½[[0, Y], [Yᵀ, 0]] with ``Y = Σ_k v_k a_k z_kᵀ``."""
    r_a = F.shape[2]
    Y = 0.5 * (F.transpose(0, 2, 1) @ (v[:, :, None] * Zq))
    out = np.zeros((F.shape[0], N, N))
    out[:, :r_a, r_a:] = Y
    out[:, r_a:, :r_a] = Y.transpose(0, 2, 1)
    return out


def _max_step(Li: NDArray[np.float64], D: NDArray[np.float64]) -> NDArray[np.float64]:
    """Largest α (capped at 1e30) with ``LLᵀ + αD ⪰ 0`` given ``Li = L⁻¹``, from the smallest eigenvalue
    of ``L⁻¹ D L⁻ᵀ`` (exact: an estimate, e.g. by power iteration, cost the predictor more iterations
    than it saved)."""
    S = Li @ D @ Li.transpose(0, 2, 1)
    # (a NaN eigenvalue, from a NaN direction, gives the cap, so a full step: its NaN point fails the next
    # factorisation and the instance leaves)
    ev = _guarded(np.linalg.eigvalsh, S, shape=S.shape[:2])[0][:, 0]
    return np.where(ev < 0, -1.0 / np.minimum(ev, -1e-300), 1e30)


def _max_step_vec(x: NDArray[np.float64], dx: NDArray[np.float64], on: NDArray[np.bool_]) -> NDArray[np.float64]:
    """Largest α with ``x + α dx ≥ 0`` on the rows ``on`` (capped at 1e30)."""
    neg = on & (dx < 0)
    ratio = np.where(neg, -x / np.where(neg, dx, -1.0), 1e30)
    return ratio.min(axis=1, initial=1e30)


class _System:
    """The Newton system of one iteration, factor-free: the HKM direction for given complementarity
    right-hand sides (predictor and corrector share it) and the step lengths to the cones' boundary."""

    def __init__(
        self,
        F: NDArray[np.float64],
        Zq: NDArray[np.float64],
        X: NDArray[np.float64],
        Zi: NDArray[np.float64],
        Li2: NDArray[np.float64],
        Rd: NDArray[np.float64],
        rp: NDArray[np.float64],
        S: NDArray[np.float64],
        s: NDArray[np.float64],
        y: NDArray[np.float64],
        iq: NDArray[np.bool_],
    ) -> None:
        self.F, self.Zq, self.X, self.Zi, self.Li2, self.Rd, self.rp, self.S = F, Zq, X, Zi, Li2, Rd, rp, S
        self.s, self.y, self.iq = s, y, iq
        self.ysafe = np.where(iq, y, 1.0)
        self.XRdZi = X @ Rd @ Zi
        self.bad = np.zeros(X.shape[0], dtype=bool)  # instances whose Schur complement LAPACK refused

    def direction(self, Rc_Zi: NDArray[np.float64], rs: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        """(ΔX, Δy, ΔZ, Δs) for the complementarity right-hand sides ``R_c Z⁻¹`` and ``r_s``:
        ``S Δy = r_p − 𝒜((R_c − X R_d) Z⁻¹) + r_s / y``, ``ΔZ = R_d − 𝒜*(Δy)``,
        ``ΔX = sym((R_c − X ΔZ) Z⁻¹)``, ``Δs = (r_s − s Δy) / y``."""
        iq = self.iq
        rhs = self.rp - _apply(self.F, self.Zq, Rc_Zi - self.XRdZi) + np.where(iq, rs / self.ysafe, 0.0)
        sol, ok_s = _guarded(np.linalg.solve, self.S, rhs[:, :, None])
        self.bad |= ~ok_s
        dy = np.where(ok_s[:, None], sol[:, :, 0], 0.0)
        dZ = self.Rd - _adjoint(self.F, self.Zq, dy, self.X.shape[1])
        dX = _sym(Rc_Zi - self.X @ dZ @ self.Zi)
        ds = np.where(iq, (rs - self.s * dy) / self.ysafe, 0.0)
        return dX, dy, dZ, ds

    def steps(
        self, dX: NDArray[np.float64], dy: NDArray[np.float64], dZ: NDArray[np.float64], ds: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The primal and dual step lengths (at most 1) to the boundary of the cones."""
        P = self.X.shape[0]
        a2 = _max_step(self.Li2, np.concatenate([dX, dZ]))  # (one LAPACK call for both cones)
        ap = np.minimum(a2[:P], _max_step_vec(self.s, ds, self.iq))
        ad = np.minimum(a2[P:], _max_step_vec(self.y, dy, self.iq))
        return np.minimum(1.0, ap), np.minimum(1.0, ad)


def ipm_many(
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    b: NDArray[np.float64],
    ineq: NDArray[np.bool_],
    *,
    tol: float = 3e-10,
    max_iter: int = 60,
    compiled: bool | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_], NDArray[np.int64]]:
    """Solve B reduced nuclear SVMs (module doc) of one shape.

    Parameters
    ----------
    Fs : (B, K, r_a) features a_k of the rows (unit norm). Zs : (B, K, r_z) their queries z_k (unit norm).
    b : (B, K) right-hand sides. ineq : (B, K) True on inequality rows, False on equality rows.
    compiled : the route: the compiled kernel (True; ImportError without numba), the NumPy one
        (False), or the compiled one where :func:`attsvm.svm.batch.compiled` allows it (None).

    Returns
    -------
    M : (B, r_a, r_z) the off-diagonal block of X. y : (B, K) the dual multipliers.
    converged : (B,) whether the instance reached ``tol`` (else it stalled below ``STALL_BELOW``, lost
        positive definiteness, had a singular Schur complement, diverged (an infeasible instance: its
        multipliers grow without bound) or ran out of iterations: M and y are its last point, or 0).
    iters : (B,) interior-point iterations.
    """
    if compiled is None:
        from . import batch  # (its switch: numba installed, ATTSVM_COMPILED not 0)

        compiled = batch.compiled() is not None
    if compiled:
        from .._threads import batch_threads
        from . import _sdp_compiled

        tols = (tol, max_iter, STALL_BELOW, STALL_ITERS, DIVERGED_Y, STEP_FRACTION)
        return _sdp_compiled.solve_stack(Fs, Zs, b, ineq, *tols, threads=batch_threads())
    B, K, r_a = Fs.shape
    r_z = Zs.shape[2]
    N = r_a + r_z
    m = ineq.sum(axis=1)  # inequality rows per instance (the LP cone's dimension)
    eye = np.eye(N)
    # start: X = Z = I, s = 1, y = 0.1 (the rows are unit and b is O(1) in solver units; of the starts
    # tried on the svm-rank instances this one takes the fewest iterations, 14 on average)
    X = np.broadcast_to(eye, (B, N, N)).copy()
    Zm = X.copy()
    y = np.where(ineq, 0.1, 0.0)
    s = np.where(ineq, 1.0, 0.0)
    iters = np.zeros(B, dtype=np.int64)
    converged = np.zeros(B, dtype=bool)
    bnorm = 1.0 + np.abs(b).max(axis=1)
    M_out = np.zeros((B, r_a, r_z))
    y_out = np.zeros((B, K))
    best = np.full(B, np.inf)
    since = np.zeros(B, dtype=np.int64)
    pend = np.arange(B)
    for _ in range(max_iter):
        if pend.size == 0:
            break
        # factors of X and Z (an instance whose cone matrix LAPACK refuses leaves, unconverged)
        L2, ok2 = _guarded(np.linalg.cholesky, np.concatenate([X, Zm]))  # (one LAPACK call for both)
        ok2 &= np.isfinite(L2).all(axis=(1, 2))  # (numpy returns NaN factors of a NaN matrix, not an error)
        P0 = X.shape[0]
        Lx, Lz, okx, okz = L2[:P0], L2[P0:], ok2[:P0], ok2[P0:]
        F, Zq, bb, iq, mm = Fs[pend], Zs[pend], b[pend], ineq[pend], m[pend]
        ok = okx & okz
        Ay = _adjoint(F, Zq, y, N)
        Rd = 0.5 * eye - Ay - Zm
        rp = bb - _apply(F, Zq, X) + s
        mu = (np.einsum("pij,pij->p", X, Zm) + (s * y).sum(axis=1)) / (N + mm)
        pobj = 0.5 * np.trace(X, axis1=1, axis2=2)
        dobj = (bb * y).sum(axis=1)
        gap = np.abs(pobj - dobj) / (1.0 + np.abs(pobj) + np.abs(dobj))
        pinf = np.abs(rp).max(axis=1) / bnorm[pend]
        dinf = np.abs(Rd).max(axis=(1, 2))
        merit = np.maximum(np.maximum(gap, pinf), dinf)
        conv = ok & (merit <= tol)
        # stalled: no halving of the merit over STALL_ITERS iterations once it is below STALL_BELOW
        # (the primal residual floors near 1e-10 on degenerate instances); the caller certifies the point
        improved = merit < 0.5 * best[pend]
        best[pend] = np.where(improved, merit, best[pend])
        since[pend] = np.where(improved, 0, since[pend] + 1)
        stalled = ok & (since[pend] >= STALL_ITERS) & (merit <= STALL_BELOW)
        diverged = np.abs(y).max(axis=1) > DIVERGED_Y
        done = conv | stalled
        if done.any():
            idx = pend[done]
            M_out[idx] = X[done][:, :r_a, r_a:]
            y_out[idx] = y[done]
            converged[idx] = conv[done]
        keep = ok & ~done & ~diverged
        if not keep.all():
            pend = pend[keep]
            if pend.size == 0:
                break
            X, Zm, y, s, Lx, Lz, Rd, rp, mu = (v[keep] for v in (X, Zm, y, s, Lx, Lz, Rd, rp, mu))
            F, Zq, bb, iq, mm = Fs[pend], Zs[pend], b[pend], ineq[pend], m[pend]
        iters[pend] += 1
        FT, ZT = F.transpose(0, 2, 1), Zq.transpose(0, 2, 1)
        Li2 = np.linalg.inv(np.concatenate([Lx, Lz]))  # (L_x⁻¹; L_z⁻¹)
        Lzi = Li2[X.shape[0] :]
        Zi = Lzi.transpose(0, 2, 1) @ Lzi
        # the Schur complement S_kl = tr(F_k X F_l Z⁻¹) from K × K Gram matrices (module doc)
        xuu, xvv, xuv = (F @ X[:, :r_a, :r_a]) @ FT, (Zq @ X[:, r_a:, r_a:]) @ ZT, (F @ X[:, :r_a, r_a:]) @ ZT
        zuu, zvv, zuv = (F @ Zi[:, :r_a, :r_a]) @ FT, (Zq @ Zi[:, r_a:, r_a:]) @ ZT, (F @ Zi[:, :r_a, r_a:]) @ ZT
        S = xuv.transpose(0, 2, 1) * zuv + xuv * zuv.transpose(0, 2, 1) + xvv * zuu + xuu * zvv
        S *= 0.25
        S[:, np.arange(K), np.arange(K)] += np.where(iq, s / np.where(iq, y, 1.0), 0.0)
        nt = _System(F, Zq, X, Zi, Li2, Rd, rp, S, s, y, iq)
        # predictor (σ = 0): R_c = −XZ, so R_c Z⁻¹ = −X
        aX, ay, aZ, as_ = nt.direction(-X, -s * y)
        ap, ad = nt.steps(aX, ay, aZ, as_)
        mu_aff = (
            np.einsum("pij,pij->p", X + ap[:, None, None] * aX, Zm + ad[:, None, None] * aZ)
            + ((s + ap[:, None] * as_) * (y + ad[:, None] * ay)).sum(axis=1)
        ) / (N + mm)
        smu = np.clip(mu_aff / mu, 0.0, 1.0) ** 3 * mu
        # corrector: R_c = σμI − XZ − ΔX_a ΔZ_a
        Rc_Zi = smu[:, None, None] * Zi - X - aX @ aZ @ Zi
        rs = np.where(iq, smu[:, None] - s * y - as_ * ay, 0.0)
        dX, dy, dZ, ds = nt.direction(Rc_Zi, rs)
        ap, ad = nt.steps(dX, dy, dZ, ds)
        ap, ad = np.minimum(1.0, STEP_FRACTION * ap), np.minimum(1.0, STEP_FRACTION * ad)
        X = _sym(X + ap[:, None, None] * dX)
        s = s + ap[:, None] * ds
        Zm = _sym(Zm + ad[:, None, None] * dZ)
        y = y + ad[:, None] * dy
        if nt.bad.any():  # a singular Schur complement: those instances leave, unconverged
            keep = ~nt.bad
            pend = pend[keep]
            X, Zm, y, s = (v[keep] for v in (X, Zm, y, s))
    if pend.size:  # out of iterations: the last points, for the caller to certify or refuse
        M_out[pend] = X[:, :r_a, r_a:]
        y_out[pend] = y
    return M_out, y_out, converged, iters
