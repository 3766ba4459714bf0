"""KKT / Newton polish of the nuclear solver (module doc of :mod:`.nuclear`, step 4).

From an approximate solution, guess the rank r and the tight rows S, and solve the smooth KKT
system of ``min ½(‖K‖² + ‖Q‖²) s.t. 𝒜_S(KQᵀ) = b_S`` by Newton's method, correcting the guess
(rows with λ < 0 released, violated rows added, a rank added while ‖𝒜*(λ)‖₂ > 1) until it holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.lapack import dgetrf, dgetrs, dsytrf, dsytrf_lwork, dsytrs

from ._factored import NuclearOptions, _Reduced

__all__: list[str] = []

logger = logging.getLogger("attsvm.svm.nuclear")

# the largest KKT residual at which a polish round counts as converged, however large ‖(K, Q)‖ is
ROUND_RES_CAP = 1e-6


@dataclass
class _Polished:
    K: NDArray[np.float64]
    Q: NDArray[np.float64]
    lam: NDArray[np.float64]  # (n, T) multipliers of the scaled rows
    residual: float
    rounds: int


def _newton_solver(
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    K: NDArray[np.float64],
    Q: NDArray[np.float64],
    lam_s: NDArray[np.float64],
    *,
    delta: float = 1e-7,
    tau: float = 1e-3,
):
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

    def from_xi(
        u: NDArray[np.float64], w: NDArray[np.float64], ra: NDArray[np.float64], rb: NDArray[np.float64]
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
    Au, Zu = At[:q], Zt[:q]
    # u coordinates kept (σ_i ≈ 1): ChR (nRi·r, s)
    ChR = (c * (At[:q][Ri][:, None, :] * ZQ.T[None] + Zt[:q][Ri][:, None, :] * FK.T[None])).reshape(-1, s)
    hR = np.repeat(h_m[Ri], r)
    nR = hR.size
    n_j = nR + s
    # weights of −S's three products: the u/w coordinates (first q) and the rest (1/h_r) in one product
    # per side; −S because the system is solved in symmetric form, its second block row negated
    wa = np.concatenate([-0.5 * (eu + 1.0 / h_p), np.full(r_a - q, -1.0 / h_r)])
    wz = np.concatenate([-0.5 * (eu + 1.0 / h_p), np.full(r_z - q, -1.0 / h_r)])
    am = -0.5 * (eu - 1.0 / h_p)

    def assemble() -> NDArray[np.float64]:
        """The lower triangle of the symmetric ``[[diag(h_R), −C_R], [−C_Rᵀ, −S]]`` (Fortran order, so
        that LAPACK factorises it in place)."""
        J = np.zeros((n_j, n_j), order="F")
        J[np.arange(nR), np.arange(nR)] = hR
        J[nR:, :nR] = -ChR.T
        Sb = J[nR:, nR:]
        np.multiply((At.T * wa) @ At, ZQ @ ZQ.T, out=Sb)
        Sb += ((Zt.T * wz) @ Zt) * (FK @ FK.T)
        X = (Au.T * am) @ Zu  # the two cross terms are X + Xᵀ
        X *= ZQ @ FK.T
        Sb += X
        Sb += X.T
        return J

    # the system is symmetric indefinite (h may be ≈ δ or < 0 on the kept rows): LAPACK's Bunch–Kaufman
    # LDLᵀ directly (scipy's wrappers cost more than the factorisation at these sizes), about 30% cheaper
    # than an LU at a few thousand unknowns
    lwork = max(1, int(dsytrf_lwork(n_j, lower=1)[0]))
    ldl, piv, info = dsytrf(assemble(), lower=1, overwrite_a=1, lwork=lwork)
    flip = np.ones(n_j)
    flip[nR:] = -1.0
    if info == 0:

        def solve(b: NDArray[np.float64]) -> NDArray[np.float64]:
            return dsytrs(ldl, piv, flip * b, lower=1)[0]
    else:  # a singular reduced system (tests/test_svm_nuclear.py forces it)
        Jl = np.tril(assemble())
        pinv = np.linalg.pinv((Jl + np.tril(Jl, -1).T) * flip[:, None])

        def solve(b: NDArray[np.float64]) -> NDArray[np.float64]:
            return pinv @ b

    def step(F: NDArray[np.float64]) -> NDArray[np.float64]:
        fu, fw, fa, fb = to_xi(-F[:nK].reshape(r_a, r), -F[nK : nK + nQ].reshape(r_z, r))
        g = -F[nK + nQ :]
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


def _newton_solver_direct(
    Fs: NDArray[np.float64],
    Zs: NDArray[np.float64],
    K: NDArray[np.float64],
    Q: NDArray[np.float64],
    lam_s: NDArray[np.float64],
    *,
    delta: float = 1e-7,
):
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
    B4 = np.zeros((r_a, r, r_z, r))
    ar = np.arange(r)
    B4[:, ar, :, ar] = -Y  # ∂(K − YQ)/∂Q = −Y ⊗ I_r
    B = B4.reshape(nK, nQ)
    J = np.zeros((nX + s, nX + s))
    J.flat[: nX * (nX + s + 1) : nX + s + 1] = 1.0 + delta
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


def _kkt_newton(
    red: _Reduced,
    idx: NDArray[np.int64],
    K: NDArray[np.float64],
    Q: NDArray[np.float64],
    lam_s: NDArray[np.float64],
    opt: NuclearOptions,
    *,
    max_newton: int = 30,
    ftol: float = 1e-13,
    ineq_s: NDArray[np.bool_] | None = None,
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
    # the residual's K − YQ and Q − YᵀK blocks are of the size of K and Q: round-off floors there, so the
    # tolerance is relative to them (an instance of near-duplicate tokens has ‖K‖ ~ 10³ in solver units)
    ftol = ftol * max(1.0, _size(K, Q))
    solver = None
    fresh = False
    hist = [nrm]
    for _ in range(max_newton):
        if nrm <= ftol:
            break
        if ineq_s is not None and nrm <= opt.early_exit_res and _wrong_sign(lam_s, ineq_s, opt.early_exit_lam):
            break
        # stagnation: a wrong rank / active-set guess has no KKT point; Newton then crawls. Give up
        # early (the caller corrects the guess) instead of spending max_newton factorisations.
        # (counted in accepted steps: a failed chord step refactors without adding to hist)
        if len(hist) > opt.newton_patience and nrm > 0.5 * hist[-opt.newton_patience]:
            break
        if solver is None:
            small = (r_a + r_z) * K.shape[1] + s <= opt.direct_kkt_max
            solver, fresh = (_newton_solver_direct if small else _newton_solver)(Fs, Zs, K, Q, lam_s), True
        step = solver(F)
        t = 1.0
        for _ls in range(30):
            Kn = K + t * step[:nK].reshape(r_a, r)
            Qn = Q + t * step[nK : nK + nQ].reshape(r_z, r)
            ln = lam_s + t * step[nK + nQ :]
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


def _size(K: NDArray[np.float64], Q: NDArray[np.float64]) -> float:
    """‖(K, Q)‖_F, the scale of the KKT residual's first two blocks."""
    return float(np.sqrt(np.vdot(K, K) + np.vdot(Q, Q)))


def _wrong_sign(lam_s: NDArray[np.float64], ineq_s: NDArray[np.bool_], rtol: float) -> bool:
    """Does an inequality row carry a multiplier below −rtol·max|λ| (the active set must change)?"""
    return bool(np.any(lam_s[ineq_s] < -rtol * np.abs(lam_s).max(initial=0.0)))


def _polish(
    red: _Reduced,
    M: NDArray[np.float64],
    lam0: NDArray[np.float64],
    opt: NuclearOptions,
    *,
    max_rounds: int = 8,
    max_failed: int = 2,
    rank_rtol: float = 1e-6,
    tight_rtol: float = 1e-3,
    dual_rank_tol: float | None = None,
) -> _Polished | None:
    """Active-set Newton polish: guess the rank r and the tight rows S from an approximate solution,
    solve the KKT system by :func:`_kkt_newton`, then fix the guess (drop rows with λ < 0, add
    violated rows, add a rank when ``‖𝒜*λ‖₂ > 1``) until the KKT conditions hold."""
    n, T = red.mask.shape
    U, sv, Vt = np.linalg.svd(M, full_matrices=False)
    if sv.size == 0 or sv[0] == 0:
        return None
    r = max(1, int((sv > rank_rtol * sv[0]).sum()))
    if dual_rank_tol is not None:
        # at the optimum rank(M) ≤ #{σ_i(𝒜*λ) = 1}: a direction of M whose dual singular value is clearly
        # below 1 is a remnant of the loose solve. Too high a rank leaves Newton without a KKT point (it
        # stalls round after round); too low a one is corrected below (a rank is added while ‖𝒜*λ‖₂ > 1)
        sy = np.linalg.svd(red.adjoint(np.where(red.ineq, np.maximum(lam0, 0.0), lam0) * red.mask), compute_uv=False)
        r = max(1, min(r, int((sy > 1.0 - dual_rank_tol).sum())))
    K = U[:, :r] * np.sqrt(sv[:r])
    Q = Vt[:r].T * np.sqrt(sv[:r])
    m = red.apply(M)
    lam_n = lam0 / max(1e-300, float(np.abs(lam0).max(initial=0.0)))
    S = red.mask & (red.eq | (np.abs(m - red.b) <= tight_rtol * np.maximum(1.0, np.abs(red.b))) | (lam_n > 1e-3))
    lam_full = lam0.copy()
    res = np.inf
    failed = 0
    for rounds in range(1, max_rounds + 1):
        idx = np.flatnonzero(S.ravel())
        if idx.size == 0:
            return None
        S_round = S.copy()
        r_round = K.shape[1]
        ineq_s = red.ineq.ravel()[idx]
        K, Q, lam_s, res = _kkt_newton(red, idx, K, Q, lam_full.ravel()[idx], opt, ineq_s=ineq_s)
        # a guess far from the optimum keeps Newton from converging round after round: hand back to
        # the augmented Lagrangian (cheaper than more Newton rounds) and retry from a better point.
        # An early exit on a wrong-signed multiplier (see _kkt_newton) is progress, not a failure.
        # a converged round: relative to ‖(K, Q)‖ as in _kkt_newton, but never above ROUND_RES_CAP (the
        # constraint block's scale is b's, not ‖(K, Q)‖'s)
        done = min(1e-10 * max(1.0, _size(K, Q)), ROUND_RES_CAP)
        early = done < res <= opt.early_exit_res and _wrong_sign(lam_s, ineq_s, opt.early_exit_lam)
        lam_full = np.zeros(n * T)
        lam_full[idx] = lam_s
        lam_full = lam_full.reshape(n, T)
        m = red.apply_factored(K, Q)
        changed = False
        neg = red.ineq & S & (lam_full < 0)
        if neg.any():  # these rows are not active: release the most negative ones
            neg &= lam_full <= opt.release_frac * lam_full[neg].min()
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
        # a round that did not converge but changed the set (rows with λ < 0 released, violated rows
        # added; a row released and added back again is no change) is progress too: on large instances
        # the first guess from a loosely solved point often needs several such rounds (at
        # (200, 32, 128), seeds 2 and 3 went from 27 s to 11–14 s); only rounds that change nothing fail
        failed = failed + 1 if res > done and not early and not (S ^ S_round).any() else 0
        if failed >= max_failed:
            return None
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
        logger.debug(
            "    polish round %d: rank %d, %d rows, residual %.1e%s; released %d, added %d, failed %d",
            rounds,
            r_round,
            idx.size,
            res,
            " (early exit)" if early else "",
            int(neg.sum()),
            int(viol.sum()),
            failed,
        )
        if not changed and res <= done:
            return _Polished(K, Q, lam_full, res, rounds)
    return None
