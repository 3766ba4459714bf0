"""Data far from unit scale are rescaled exactly, by powers of two, before solving (attsvm.svm.reduction
.prescale): a squared row norm overflows float64 beyond about 2^511, so without it an instance at
X·1e200 "vanished" (status "error") although its solution is representable. Each answer is checked
against the unit-scale fit of the same instance, rescaled analytically (X → cX gives W/c, λ/c^degree).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attsvm.datasets import paper_instance
from attsvm.problem import AttentionProblem
from attsvm.svm import AttentionSVM, att_svm_constraints, farkas_certificate, pipeline
from attsvm.svm.reduction import PRESCALE_EXP, prescale

# W and λ against the unit-scale fit, relative to their largest entry: the Frobenius and ℓp solvers are
# exact to round-off; the others stop at their certificate's tolerance (1e-6 relative gap)
W_RTOL = {"fro": 1e-9, "lp": 1e-9, "nuc": 1e-5, "l1": 1e-5, "linf": 1e-5}
NORM_KW = {"fro": {}, "nuc": {}, "l1": {}, "linf": {}, "lp": {"p": 1.5}}
DEGREE = {"fro": 2, "nuc": 1, "l1": 1, "linf": 1, "lp": 2}


def _scaled(p: AttentionProblem, cx: float, cz: float = 1.0) -> AttentionProblem:
    return AttentionProblem(p.X * cx, p.y, p.head, Z=p.queries * cz)


def _assert_rescaled(fit: AttentionSVM, ref: AttentionSVM, w_factor: float, lam_factor: float) -> None:
    """``fit`` is ``ref`` with W divided by ``w_factor`` and λ by ``lam_factor``; margins and support equal."""
    assert fit.status_ == ref.status_ == "optimal"
    rtol = W_RTOL[ref.norm]
    with np.errstate(over="ignore", under="ignore"):
        W, lam = fit.W_ * w_factor, fit.dual_coef_ * lam_factor
    np.testing.assert_allclose(W, ref.W_, rtol=0, atol=rtol * np.abs(ref.W_).max())
    np.testing.assert_allclose(lam, ref.dual_coef_, rtol=0, atol=rtol * np.abs(ref.dual_coef_).max())
    assert fit.objective_ * w_factor == pytest.approx(ref.objective_, rel=rtol)
    np.testing.assert_allclose(fit.margins_, ref.margins_, rtol=rtol)
    np.testing.assert_array_equal(fit.support_, ref.support_)
    assert fit.relative_violation_ <= fit.tol and fit.relative_gap_ <= fit.tol


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e200, 1e300])
@pytest.mark.parametrize("norm", ["nuc", "l1", "linf"])
def test_norms_of_degree_one_solve_at_any_representable_scale(norm, scale):
    # W ~ 1/scale and λ ~ 1/scale are representable up to float64's limits: every such fit is optimal
    p = paper_instance(6, 8, 10, seed=0)
    a = p.optimal_tokens()
    ref = AttentionSVM(norm).fit(p, a)
    for q in (_scaled(p, scale), _scaled(p, 1.0, scale)):
        fit = AttentionSVM(norm).fit(q, a)
        _assert_rescaled(fit, ref, scale, scale)
        users = att_svm_constraints(q, a)  # (constraints_ is the user's set, not the rescaled one)
        np.testing.assert_array_equal(fit.constraints_.A, users.A)
        np.testing.assert_array_equal(fit.constraints_.Z, users.Z)
    (many,) = AttentionSVM("nuc").fit_many([_scaled(p, scale)], [a]) if norm == "nuc" else (None,)
    if many is not None:
        _assert_rescaled(many, AttentionSVM("nuc").fit(p, a), scale, scale)


@pytest.mark.parametrize("scale", [1e-120, 1e-40, 1e40, 1e120])
@pytest.mark.parametrize("norm", ["fro", "lp", "nuc"])
def test_data_beyond_the_prescale_range_are_rescaled_exactly(norm, scale):
    p = paper_instance(6, 8, 10, seed=0)
    a = p.optimal_tokens()
    ref = AttentionSVM(norm, **NORM_KW[norm]).fit(p, a)
    assert "prescale" not in ref.info_  # (unit-scale data take the usual path, unchanged)
    fit = AttentionSVM(norm, **NORM_KW[norm]).fit(_scaled(p, scale), a)
    assert fit.info_["prescale"] > 0
    power = scale ** DEGREE[norm]
    _assert_rescaled(fit, ref, scale, power)
    assert fit.duality_gap_ == pytest.approx(ref.duality_gap_ / power, abs=1e-12 / power)
    (many,) = AttentionSVM(norm, **NORM_KW[norm]).fit_many([_scaled(p, scale)], [a])
    _assert_rescaled(many, ref, scale, power)


@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_opposite_scales_of_x_and_z_cancel(norm):
    # a'ᵀ W z' with a' = a·1e200 and z' = z·1e-200 is aᵀ W z: the same W as at unit scale. Before, ‖a‖²
    # overflowed and the instance "vanished" ("error")
    p = paper_instance(6, 8, 10, seed=0)
    a = p.optimal_tokens()
    ref = AttentionSVM(norm).fit(p, a)
    q = _scaled(p, 1e200, 1e-200)
    for fit in (AttentionSVM(norm).fit(q, a), *AttentionSVM(norm).fit_many([q, q], [a, a])):
        _assert_rescaled(fit, ref, 1.0, 1.0)


@pytest.mark.parametrize("scale", [1e200, 1e-200])
@pytest.mark.parametrize("norm", ["fro", "lp"])
def test_multipliers_beyond_float64_are_an_error_never_zeros(norm, scale):
    # ½‖W‖² has degree 2: λ ~ 1/scale² under- or overflows float64 although W is representable. The fit
    # says so ("error", with what to do) rather than report "optimal" with λ = 0 or inf
    p = paper_instance(6, 8, 10, seed=0)
    a = p.optimal_tokens()
    with pytest.warns(RuntimeWarning, match="multipliers"):
        fit = AttentionSVM(norm, **NORM_KW[norm]).fit(_scaled(p, scale), a)
    assert fit.status_ == "error" and fit.W_ is None and fit.dual_coef_ is None
    assert "rescale X or Z" in fit.info_["message"]


@pytest.mark.parametrize("scale", [1e250, 1e-250])
@pytest.mark.parametrize("norm", ["fro", "nuc"])
def test_infeasible_far_from_unit_scale_keeps_a_verified_farkas_certificate(norm, scale):
    p = paper_instance(6, 8, 3, seed=1)  # d = 3 < T − 1: infeasible for this draw
    a = p.optimal_tokens(ties="first")
    q = _scaled(p, scale)
    fit = AttentionSVM(norm).fit(q, a)
    assert fit.status_ == "infeasible"
    cert = farkas_certificate(att_svm_constraints(q, a), fit.certificate_)
    assert cert.valid
    # the residuals are at round-off (about 1e-16 of the data's scale): summed in another order, the recomputed one
    # agrees to a factor, not to digits (the factor depends on the BLAS kernels of the machine)
    assert fit.certificate_residual_ == pytest.approx(cert.residual, rel=0.5, abs=1e-300)


def test_rank_constrained_factors_are_rescaled_with_w():
    p = paper_instance(6, 8, 10, seed=0)
    a = p.optimal_tokens()
    fit = AttentionSVM("nuc", rank=2).fit(_scaled(p, 1e200), a)
    assert fit.status_ == "optimal"
    K, Q = fit.factors_
    np.testing.assert_allclose(K @ Q.T, fit.W_, rtol=0, atol=1e-9 * np.abs(fit.W_).max())
    ref = AttentionSVM("nuc", rank=2).fit(p, a)
    np.testing.assert_allclose(fit.W_ * 1e200, ref.W_, rtol=0, atol=1e-6 * np.abs(ref.W_).max())


def test_prescale_is_exact_and_only_beyond_its_range():
    p = paper_instance(3, 4, 5, seed=0)
    cs = att_svm_constraints(p, p.optimal_tokens())
    assert prescale(cs) is None
    edge = att_svm_constraints(_scaled(p, 2.0 ** (PRESCALE_EXP - 4)), p.optimal_tokens())
    assert prescale(edge) is None
    big = att_svm_constraints(_scaled(p, 1e200, 1e-30), p.optimal_tokens())
    out = prescale(big)
    assert out is not None
    scaled, kappa = out
    ca = scaled.A[big.mask][0, 0] / big.A[big.mask][0, 0]
    cz = scaled.Z[0, 0] / big.Z[0, 0]
    for c in (ca, cz):  # powers of two: the rescaling loses no bit
        assert np.frexp(c)[0] == 0.5
    np.testing.assert_array_equal(scaled.A, big.A * ca)
    np.testing.assert_array_equal(scaled.Z, big.Z * cz)
    assert kappa == ca * cz
    assert 0.5 <= np.abs(scaled.A).max() <= 1.0 and 0.5 <= np.abs(scaled.Z).max() <= 1.0
    np.testing.assert_array_equal(scaled.rhs, big.rhs)


def test_no_status_changes_inside_the_range():
    # the usual path is untouched: a fit of unit-scale data has no "prescale" entry and warns nothing
    p = paper_instance(6, 8, 10, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit = AttentionSVM().fit(p)
    assert fit.status_ == "optimal" and "prescale" not in fit.info_


def test_entries_below_round_off_may_flush_but_no_others():
    # mapping back by κ = 2^-1000 flushes W' entries below ~1e-8 of float64's range to 0: an entry at
    # 1e-30 of the largest carries no information (round-off is 2e-16), so the fit stays optimal; with
    # κ = 2^-1070 the largest entries flush too, and that is an "error", never a W of zeros
    p = paper_instance(6, 8, 10, seed=0)
    a = p.optimal_tokens()
    for kappa, status in ((2.0**-1000, "optimal"), (2.0**-1070, "error")):
        fit = AttentionSVM("nuc").fit(p, a)
        W = fit.W_.copy()
        W[0, 0] = 1e-30 * np.abs(W).max()
        fit.W_ = W
        # (the last stage of the fit's pipeline on the fitted attributes)
        rec = pipeline.FitRecord({k: v for k, v in fit.__dict__.items() if k.endswith("_") or k == "_rank"})
        out = pipeline.unscale(rec, fit.constraints_, kappa, degree=1).fields
        assert out["status_"] == status and len(rec.warnings) == (status == "error")
        if status == "optimal":
            assert out["W_"][0, 0] == 0.0 and np.count_nonzero(out["W_"]) == W.size - 1
