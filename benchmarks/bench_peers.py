"""Our Frobenius attention SVM against dedicated QP and SVM solvers, measured in the same run.

The peers solve the Frobenius Att-SVM's dual QP ``min ½λᵀGλ − 1ᵀλ  s.t. λ ≥ 0`` (docs/spec.md §3),
``G_kl = (a_kᵀa_l)(z_kᵀz_l)`` over the K constraint rows of ``paper_instance(n, T, d, seed=0)`` at its
optimal tokens; their W is ``Σ_k λ_k a_k z_kᵀ``. Each peer's time **includes building G** (its
kernel), which is part of solving the SVM; the build time is also printed on its own. Ours is
``AttentionSVM("fro").fit`` with its certificate, and where fit_many batches them (K ≤ 400 with numba,
80 without) also ``fit_many`` (a fitted estimator per instance) and ``fit_stack`` (the same answers as
stacked arrays, from the stacked data) over R instances: time per instance, on one thread and on the
machine's cores, certificates included.

Peers (each skipped when not installed; ``pip install daqp piqp proxsuite osqp``):

* DAQP (dual active set), PIQP (proximal interior point, dense), ProxQP (proxsuite, dense),
  Clarabel (interior point, called directly), OSQP (ADMM, with polishing);
* libsvm's SMO (scikit-learn ``SVC(kernel="precomputed")``): libsvm always fits a bias b, so the
  data are mirrored — rows f_k with label +1 and −f_k with label −1, kernel ``[[G, −G], [−G, G]]`` —
  which makes b = 0 optimal by symmetry; C = 1e8 makes the margin hard, and λ_k = α_k⁺ + α_k⁻.

Every peer's W is compared with ours (relative Frobenius distance); a row says so when it exceeds
1e-6. Timings on a shared machine are noisy; the ratios compare runs made back to back.

    .venv/bin/python benchmarks/bench_peers.py            # K = 42 … 1,900
    .venv/bin/python benchmarks/bench_peers.py --quick    # K = 42 and 210
    .venv/bin/python benchmarks/bench_peers.py --large    # also (200, 32, 128), K = 6,200 (minutes)

A full run (no --quick, the default --repeat) writes its table to benchmarks/records/ (``--record`` records any
run, ``--no-record`` none; docs/performance.md is generated from the records).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
import warnings
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
from _options import positive_int
from _record import Recorder, add_option, wanted

SIZES = [(6, 8, 10), (15, 15, 20), (50, 20, 50), (100, 20, 100)]
LARGE = (200, 32, 128)
AGREE = 1e-6  # relative W agreement every peer must reach (else the row says why)
METHODS = ("fit_many", "fit_stack")


def _rows(n: int, T: int, d: int):
    from attsvm.datasets import paper_instance
    from attsvm.svm import att_svm_constraints

    p = paper_instance(n, T, d, seed=0)
    tok = p.optimal_tokens(ties="first")
    cs = att_svm_constraints(p, tok)
    i, t = np.nonzero(cs.mask)
    return p, tok, cs.A[i, t], cs.Z[i]  # (K, d) features a_k, (K, d) queries z_k


def gram(Af: np.ndarray, Zf: np.ndarray) -> np.ndarray:
    G = Af @ Af.T
    G *= Zf @ Zf.T
    return G


def peer_daqp(G: np.ndarray) -> np.ndarray:
    import daqp

    K = G.shape[0]
    x, _, flag, _ = daqp.solve(
        G, -np.ones(K), np.zeros((0, K)), np.full(K, 1e30), np.zeros(K), np.zeros(K, dtype=np.intc)
    )
    if flag < 1:
        raise RuntimeError(f"DAQP exit flag {flag}")
    return np.asarray(x)


def peer_piqp(G: np.ndarray) -> np.ndarray:
    import piqp

    K = G.shape[0]
    s = piqp.DenseSolver()
    s.settings.eps_abs = s.settings.eps_rel = 1e-10
    s.setup(np.asfortranarray(G), -np.ones(K), x_l=np.zeros(K), x_u=np.full(K, np.inf))
    status = s.solve()
    if status != piqp.PIQP_SOLVED:
        raise RuntimeError(f"PIQP {status}")
    return np.asarray(s.result.x)


def peer_proxqp(G: np.ndarray) -> np.ndarray:
    from proxsuite import proxqp

    K = G.shape[0]
    res = proxqp.dense.solve(G, -np.ones(K), None, None, np.eye(K), np.zeros(K), np.full(K, 1e30), eps_abs=1e-10)
    return np.asarray(res.x)


def peer_clarabel(G: np.ndarray) -> np.ndarray:
    import clarabel
    import scipy.sparse as sp

    K = G.shape[0]
    st = clarabel.DefaultSettings()
    st.verbose = False
    st.tol_gap_abs = st.tol_gap_rel = st.tol_feas = 1e-10
    solver = clarabel.DefaultSolver(
        sp.triu(sp.csc_matrix(G)).tocsc(), -np.ones(K), -sp.identity(K, format="csc"), np.zeros(K),
        [clarabel.NonnegativeConeT(K)], st,
    )  # fmt: skip
    sol = solver.solve()
    if str(sol.status) not in ("Solved", "SolverStatus.Solved"):
        raise RuntimeError(f"Clarabel {sol.status}")
    return np.asarray(sol.x)


def peer_osqp(G: np.ndarray) -> np.ndarray:
    import osqp
    import scipy.sparse as sp

    K = G.shape[0]
    m = osqp.OSQP()
    m.setup(
        sp.triu(sp.csc_matrix(G)).tocsc(), -np.ones(K), sp.identity(K, format="csc"), np.zeros(K), np.full(K, np.inf),
        eps_abs=1e-9, eps_rel=1e-9, polishing=True, max_iter=200_000, verbose=False,
    )  # fmt: skip
    res = m.solve()
    return np.asarray(res.x)


def peer_libsvm(G: np.ndarray) -> np.ndarray:
    from sklearn.svm import SVC

    K = G.shape[0]
    M = np.block([[G, -G], [-G, G]])
    y = np.concatenate([np.ones(K), -np.ones(K)])
    svc = SVC(kernel="precomputed", C=1e8, tol=1e-10, shrinking=True, max_iter=-1).fit(M, y)
    alpha = np.zeros(2 * K)
    alpha[svc.support_] = np.abs(svc.dual_coef_[0])
    return alpha[:K] + alpha[K:]


PEERS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "DAQP": ("daqp", peer_daqp),
    "PIQP": ("piqp", peer_piqp),
    "ProxQP": ("proxsuite", peer_proxqp),
    "Clarabel": ("clarabel", peer_clarabel),
    "OSQP": ("osqp", peer_osqp),
    "libsvm": ("sklearn", peer_libsvm),
}


def best(f: Callable[[], object], repeat: int, budget: float) -> tuple[float, object]:
    """Minimum wall time over up to ``repeat`` calls (fewer once ``budget`` seconds are spent)."""
    times, out, spent = [], None, 0.0
    for _ in range(repeat):
        out = None  # (the last call's result is freed before the clock starts: 1,000 estimators take ~0.7 ms)
        t0 = time.perf_counter()
        out = f()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent > budget:
            break
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="K = 42 and 210 only")
    ap.add_argument("--large", action="store_true", help="also (200, 32, 128), K = 6,200")
    ap.add_argument("--repeat", type=positive_int, default=5)
    add_option(ap, "no --quick, the default --repeat")
    args = ap.parse_args()
    rec = Recorder("bench_peers", wanted(args, ap, ("quick", "repeat")))
    warnings.simplefilter("ignore")
    from attsvm._threads import batch_threads
    from attsvm.datasets import paper_instance
    from attsvm.svm import AttentionSVM, batch

    sizes = SIZES[:2] if args.quick else SIZES + ([LARGE] if args.large else [])
    avail = {k: v for k, v in PEERS.items() if importlib.util.find_spec(v[0]) is not None}
    missing = sorted(set(PEERS) - set(avail))
    if missing:
        print(f"not installed, skipped: {', '.join(missing)}")
    threads = sorted({1, batch_threads()})
    rows = []
    route = "compiled" if batch.compiled() is not None else "NumPy"
    for n, T, d in sizes:
        p, tok, Af, Zf = _rows(n, T, d)
        K = Af.shape[0]
        t_ours, ours = best(lambda p=p, tok=tok: AttentionSVM().fit(p, tok), args.repeat, 10.0)
        W0 = ours.W_  # type: ignore[attr-defined]
        t_gram, G = best(lambda Af=Af, Zf=Zf: gram(Af, Zf), args.repeat, 2.0)
        head = f"\n(n, T, d) = {(n, T, d)}, K = {K}: ours (fit, certified) {t_ours * 1e3:.3f} ms"
        print(f"{head}; building G {t_gram * 1e3:.3f} ms")
        many: dict[tuple[str, int], float] = {}  # (method, threads) → time per instance
        if K <= batch.max_k(AttentionSVM()):
            R = 1000  # (the measure: the time per instance over 1,000 instances)
            probs = [paper_instance(n, T, d, seed=s) for s in range(R)]
            toks = [q.optimal_tokens(ties="first") for q in probs]
            est = AttentionSVM()
            X = np.stack([q.X for q in probs])  # fit_stack's input: the stacked data of a sweep
            Z = np.stack([q.queries for q in probs])
            A = np.stack(toks)
            stack = est.fit_stack(X, Z, A)
            dW = float(np.linalg.norm(stack.W[0] - W0) / np.linalg.norm(W0))
            print(f"  fit_stack: {int(stack.optimal.sum())}/{R} optimal; instance 0's W against fit's: {dW:.1e}")
            for th in threads:
                os.environ["ATTSVM_NUM_THREADS"] = str(th)
                t_many, _ = best(lambda est=est, probs=probs, toks=toks: est.fit_many(probs, toks), args.repeat, 30.0)
                t_stack, _ = best(lambda est=est, X=X, Z=Z, A=A: est.fit_stack(X, Z, A), args.repeat, 30.0)
                many["fit_many", th] = t_many / R
                many["fit_stack", th] = t_stack / R
                print(
                    f"  ours ({route}, {th} thread(s)) over {R} instances, per instance: fit_many "
                    f"{t_many / R * 1e3:.4f} ms (estimators), fit_stack {t_stack / R * 1e3:.4f} ms (arrays)"
                )
            os.environ.pop("ATTSVM_NUM_THREADS")
        fastest, fastest_name = np.inf, ""
        cells: dict[str, str] = {}
        for name, (_, solve) in avail.items():
            try:
                t_solve, lam = best(lambda solve=solve, G=G: solve(G), args.repeat, 20.0)
            except Exception as exc:  # a peer's failure is a row, never the end of the benchmark
                print(f"  {name:9s} failed: {type(exc).__name__}: {exc}")
                cells[name] = f"failed ({type(exc).__name__})"
                continue
            W = (Af * np.asarray(lam)[:, None]).T @ Zf
            rel = float(np.linalg.norm(W - W0) / np.linalg.norm(W0))
            total = t_solve + t_gram
            if total < fastest:
                fastest, fastest_name = total, name
            cells[name] = f"{total * 1e3:.3f}" + ("" if rel <= AGREE else f" (ΔW {rel:.0e})")
            note = "" if rel <= AGREE else f"  (W differs by {rel:.1e}: the peer stops at its own tolerance)"
            line = f"  {name:9s} {total * 1e3:10.3f} ms (solve {t_solve * 1e3:.3f})  ours ×{total / t_ours:7.1f}"
            print(f"{line}  ΔW {rel:.1e}{note}")
        if np.isfinite(fastest):
            print(f"  fastest peer {fastest * 1e3:.3f} ms: ours is {fastest / t_ours:.1f}× as fast")
            for (how, th), t in many.items():
                print(f"  {how} ({th} thread(s)) per instance: {fastest / t:.1f}× as fast as the fastest peer's solve")
        per = {how: " / ".join(f"{t * 1e3:.4f}" for (h, _), t in many.items() if h == how) for how in METHODS}
        ratio = ""
        if np.isfinite(fastest):
            ratio = f"fit {fastest / t_ours:.2g}×"
            for how in METHODS if many else ():
                ratio += f", {how} " + " / ".join(f"{fastest / t:.1f}×" for (h, _), t in many.items() if h == how)
            ratio += f" ({fastest_name})"
        rows.append(
            [str((n, T, d)), K, f"{t_ours * 1e3:.3f}", f"{t_gram * 1e3:.3f}", per["fit_many"], per["fit_stack"],
             *(cells.get(name, "") for name in avail), ratio]
        )  # fmt: skip
    ts = " / ".join(str(th) for th in threads)
    notes = [
        "times in ms; each peer's time includes building G (its kernel), also shown alone",
        f"every peer's W agrees with ours to ≤ {AGREE:.0e} relative, unless its cell gives ΔW".replace("e-0", "e-"),
        f"fit_many, fit_stack: time per instance over 1,000 instances on {ts} thread(s), {route} route",
        "libsvm: mirrored data (f_k → +1, −f_k → −1), so b = 0 by symmetry",
        "× fastest peer: the fastest peer's single solve over ours",
    ]
    if missing:
        notes.append(f"not installed, skipped: {', '.join(missing)}")
    rec.table(
        "Ours against dedicated QP and SVM solvers",
        ["(n, T, d)", "K", "ours fit", "building G", f"ours fit_many ({ts} threads)",
         f"ours fit_stack ({ts} threads)", *avail, "× fastest peer"],
        rows,
        notes,
    )  # fmt: skip
    rec.write()


if __name__ == "__main__":
    main()
