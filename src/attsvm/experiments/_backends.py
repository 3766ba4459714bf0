"""Solvers and trainer the experiments call, behind one small interface.

The experiments need (i) the Frobenius and nuclear attention SVMs of SPEC §3 and the equality-
constrained SVM-eq / W_fin problems of SPEC §5, all phrased as a :class:`~attsvm.svm.ConstraintSet`,
and (ii) batched normalized gradient descent of SPEC §4 over many runs at once.

Private implementations live here so that the experiments are self-contained and reproducible:

* Frobenius: the least-distance program ``min ‖w‖ s.t. Gw ≥ h, Ew = b`` on the reduced variable
  (``W = U M Vᵀ``, SPEC §3 "Structure") solved exactly by the Lawson–Hanson NNLS route, then
  polished on its active set. Infeasibility comes out of the same NNLS (a zero residual is the
  theorem-of-alternatives certificate of SPEC §3).
* Nuclear: a vectorised cvxpy formulation on the reduced variable (Clarabel).
* Training: :func:`train_runs`, the paper's normalized GD batched over runs, via :func:`attsvm.train.train`.

``svm_solve`` prefers the project's ``attsvm.svm.AttentionSVM`` when it is importable (it carries the
full certificate) and falls back to the private solvers otherwise; every result reports which
backend produced it and its max constraint violation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ..problem import AttentionProblem
from ..svm._base import ConstraintSet, att_svm_constraints

__all__ = ["SVMResult", "solve_constraints", "svm_solve", "train_runs", "TrainOutput", "VIOLATION_TOL"]

log = logging.getLogger(__name__)

# A solution is accepted when its max constraint violation is below this (relative to the margin 1).
VIOLATION_TOL = 1e-6
# NNLS residual below which the least-distance program is declared infeasible.
_INFEASIBLE_TOL = 1e-9

Norm = Literal["fro", "nuc"]


@dataclass
class SVMResult:
    """A solved attention SVM: ``W`` (None when infeasible), status and certificate numbers."""

    W: NDArray[np.float64] | None
    status: str
    max_violation: float
    objective: float
    backend: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.W is not None and self.status.startswith("optimal")


# ---------------------------------------------------------------------------- Frobenius (exact LDP)
def _ldp(G: NDArray[np.float64], h: NDArray[np.float64]) -> NDArray[np.float64] | None:
    """``argmin ‖u‖ s.t. G u ≥ h`` via NNLS (Lawson & Hanson, ch. 23); None when infeasible."""
    from scipy.optimize import nnls

    m, p = G.shape
    if m == 0:
        return np.zeros(p)
    E = np.vstack([G.T, h[None, :]])  # (p+1, m)
    f = np.zeros(p + 1)
    f[-1] = 1.0
    x, _ = nnls(E, f, maxiter=50 * (m + p + 1))
    r = E @ x - f
    if np.linalg.norm(r) < _INFEASIBLE_TOL or r[-1] >= 0:
        return None
    u = -r[:p] / r[-1]
    # polish on the active set: the exact minimum-norm point of {G_A u = h_A}
    act = x > 0
    if act.any():
        GA = G[act]
        try:
            u2 = GA.T @ np.linalg.lstsq(GA @ GA.T, h[act], rcond=None)[0]
            if np.all(G @ u2 - h >= -1e-10 * max(1.0, np.abs(h).max())):
                u = u2
        except np.linalg.LinAlgError:  # pragma: no cover
            pass
    return u


def _features(cs: ConstraintSet) -> tuple[Any, NDArray[np.float64], NDArray[np.bool_]]:
    """Reduced subspaces and the vectorised features ``vec(a'_k z'_kᵀ)`` of the masked pairs."""
    sub = cs.subspaces()
    F = np.einsum("nta,nb->ntab", sub.A, sub.Z).reshape(cs.n, cs.T, -1)  # (n, T, ra*rz)
    return sub, F, cs.mask


def _solve_fro(cs: ConstraintSet) -> SVMResult:
    sub, F, mask = _features(cs)
    ra, rz = sub.A.shape[-1], sub.Z.shape[-1]
    eq = cs.equality[mask]
    Fk, bk = F[mask], cs.rhs[mask]
    Feq, beq, Gin, hin = Fk[eq], bk[eq], Fk[~eq], bk[~eq]
    p = ra * rz
    if Feq.shape[0]:
        w0 = np.linalg.lstsq(Feq, beq, rcond=None)[0]
        if np.abs(Feq @ w0 - beq).max(initial=0.0) > 1e-8 * max(1.0, np.abs(beq).max(initial=0.0)):
            return SVMResult(None, "infeasible", np.inf, np.nan, "private-ldp", {"reason": "equalities"})
        _, s, vt = np.linalg.svd(Feq, full_matrices=True)
        rank = int((s > 1e-12 * (s[0] if s.size else 1.0)).sum())
        N = vt[rank:].T  # (p, p - rank) null space of the equalities
    else:
        w0, N = np.zeros(p), np.eye(p)
    u = _ldp(Gin @ N, hin - Gin @ w0) if Gin.shape[0] else np.zeros(N.shape[1])
    if u is None:
        return SVMResult(None, "infeasible", np.inf, np.nan, "private-ldp")
    M = (w0 + N @ u).reshape(ra, rz)
    W = sub.lift(M)
    viol = cs.violation(W)
    return SVMResult(W, "optimal" if viol <= VIOLATION_TOL else "optimal_inaccurate", viol,
                     float(np.linalg.norm(W)), "private-ldp")


# ---------------------------------------------------------------------------- nuclear (cvxpy, reduced)
def _solve_nuc(cs: ConstraintSet) -> SVMResult:
    import cvxpy as cp

    sub, F, mask = _features(cs)
    ra, rz = sub.A.shape[-1], sub.Z.shape[-1]
    eq = cs.equality[mask]
    Ak = sub.A[mask]  # (K, ra)
    Zk = np.broadcast_to(sub.Z[:, None, :], (cs.n, cs.T, rz))[mask]  # (K, rz)
    bk = cs.rhs[mask]
    M = cp.Variable((ra, rz))
    m = cp.sum(cp.multiply(Ak @ M, Zk), axis=1)
    cons = []
    if (~eq).any():
        cons.append(m[np.flatnonzero(~eq)] >= bk[~eq])
    if eq.any():
        cons.append(m[np.flatnonzero(eq)] == bk[eq])
    prob = cp.Problem(cp.Minimize(cp.normNuc(M)), cons)
    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.SolverError as exc:  # pragma: no cover - reported, never swallowed silently
        return SVMResult(None, "error", np.inf, np.nan, "private-cvxpy", {"error": str(exc)})
    if prob.status in ("infeasible", "infeasible_inaccurate") or M.value is None:
        return SVMResult(None, "infeasible" if "infeasible" in prob.status else prob.status, np.inf, np.nan,
                         "private-cvxpy")
    W = sub.lift(np.asarray(M.value))
    if not cs.equality.any() and np.all(cs.rhs[cs.mask] == 1.0):
        # interior-point round-off leaves margins like 1 − 1e-7; rescaling to min margin 1 restores
        # exact feasibility at a relative objective cost of the same size
        mmin = float(cs.apply(W)[cs.mask].min())
        if 0.0 < mmin < 1.0:
            W = W / mmin
    viol = cs.violation(W)
    status = "optimal" if prob.status == "optimal" and viol <= VIOLATION_TOL else "optimal_inaccurate"
    return SVMResult(W, status, viol, float(np.linalg.svd(W, compute_uv=False).sum()), "private-cvxpy")


def solve_constraints(cs: ConstraintSet, norm: Norm = "fro") -> SVMResult:
    """Minimum-norm W under the constraints of ``cs`` (SPEC §3, §5)."""
    if norm not in ("fro", "nuc"):
        raise ValueError(f"norm must be one of 'fro', 'nuc'; got {norm!r}")
    try:
        from ..svm import AttentionSVM  # type: ignore[attr-defined]
    except ImportError:
        AttentionSVM = None
    if AttentionSVM is not None and hasattr(AttentionSVM, "fit_constraints"):
        try:
            est = AttentionSVM(norm=norm).fit_constraints(cs)
            W = getattr(est, "W_", None)
            status = str(getattr(est, "status_", "unknown"))
            # accept the project's solution when its certificate holds (status is kept as reported:
            # "max_iter" / "optimal_inaccurate" mean the duality gap, not feasibility, is above tol)
            if W is not None and status in ("optimal", "optimal_inaccurate", "max_iter"):
                viol = cs.violation(np.asarray(W))
                if viol <= VIOLATION_TOL:
                    return SVMResult(np.asarray(W), status, viol, float(getattr(est, "objective_", np.nan)),
                                     "attsvm.svm", {"duality_gap": getattr(est, "duality_gap_", None)})
            if status == "infeasible":
                return SVMResult(None, "infeasible", np.inf, np.nan, "attsvm.svm")
        except Exception as exc:  # the project solver failed: fall back, but say so
            log.warning("attsvm.svm.AttentionSVM failed (%s); using the private %s solver", exc, norm)
    return _solve_fro(cs) if norm == "fro" else _solve_nuc(cs)


def svm_solve(problem: AttentionProblem, tokens: NDArray[np.int64] | None, norm: Norm = "fro") -> SVMResult:
    """Att-SVM(α) (``norm="fro"``, W_mm) or Att-SVM* (``norm="nuc"``, W*_mm) of SPEC §3."""
    return solve_constraints(att_svm_constraints(problem, tokens), norm)


# ---------------------------------------------------------------------------- batched training
@dataclass
class TrainOutput:
    """Batched training record: final W (R, d, d), W at the recorded states (R, S, d, d), their update
    counts (S,), the mean-over-sequences top softmax probability (R, S), the final softmax (R, n, T)
    and the risk (R, S)."""

    W: NDArray[np.float64]
    W_hist: NDArray[np.float64]
    steps: NDArray[np.int64]
    sfx_max_mean: NDArray[np.float64]
    softmax: NDArray[np.float64]
    loss: NDArray[np.float64]


def train_runs(problems: list[AttentionProblem], *, param: Literal["W", "KQ"] = "W", steps: int = 2000,
               lr: float = 0.1, m: int | None = None, seeds: list[int] | None = None, init: Any = "pytorch",
               record_every: int = 10, init_scale: float | None = None) -> TrainOutput:
    """Normalized GD of SPEC §4 on R problems at once, through :func:`attsvm.train.train`.

    One batched float64 tensor program; ``W ← W − η ∇L/(‖∇L‖_F + ε)`` per run, per factor for
    (K, Q) with the published ε(‖K‖² + ‖Q‖²) penalty. Run r starts from its own generator seeded
    with ``seeds[r]`` (default 0..R−1), so a run never depends on the batch it is in. W is recorded
    after every ``record_every``-th update (k = 0 is the initialisation).
    """
    from ..train import train

    R = len(problems)
    seeds = list(range(R)) if seeds is None else [int(x) for x in seeds]
    res = train(problems, param=param, steps=steps, lr=lr, normalized=True, init=init, init_scale=init_scale,
                m=m, seed=seeds, record_every=record_every, record_W=True, progress=False, threads=1)
    h = res.history
    return TrainOutput(W=res.W, W_hist=h["W"], steps=np.asarray(h["step"], dtype=np.int64),
                       sfx_max_mean=h["max_prob"].mean(-1), softmax=res.probs, loss=h["loss"])
