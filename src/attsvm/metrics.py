"""Metrics on attention matrices and trajectories (docs/spec.md §4, §7).

The dense helpers live in :mod:`attsvm._linalg` (so solvers can use them without importing
upward) and are re-exported here.
"""

from __future__ import annotations

from ._linalg import RANK_TOL, correlation, effective_rank, matrix_rank, nuc_fro_ratio, singular_values

__all__ = ["correlation", "singular_values", "matrix_rank", "effective_rank", "nuc_fro_ratio", "RANK_TOL"]
