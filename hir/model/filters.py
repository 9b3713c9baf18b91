"""Spectral filters of the base and the entity trend factor, as plain functions of arrays.

The base scores a user u and an entity e by ``x_u D^-b V diag(g(s)) V^T D^b [:, e]`` (see
:mod:`hir.model.spectral`): ``V, s`` the top singular vectors and values of the normalised
engagement matrix ``R~ = D_u^-1/2 R D_e^-1/2``, so ``s^2`` are the eigenvalues of the item-item
graph ``R~^T R~`` in [0, 1]. ``g(s) = a + h(s^2)`` is the filter's response on the kept components:

- ``a`` (``ideal_weight``) weighs the *ideal low-pass* (every kept component alike, GF-CF's second
  term, Shen et al. CIKM 2021);
- ``h`` is a polynomial of the item-item graph: ``linear`` (``s^2``, GF-CF's normalised item-item
  filter, and hir's filter before the family existed), ``sharp`` (``s^4``, a steeper low-pass),
  ``bspm`` (``s^2 e^(-t s^2)`` truncated to a degree-4 Taylor polynomial, BSPM's sharpening, Choi
  et al. SIGIR 2023), ``cheby`` (ChebyCF's plateau, order 8, φ = 1.5, Kim et al. SIGIR 2025) or
  ``none`` (the ideal low-pass alone).

Only the ratio of ``a`` to ``h`` matters for a ranking.
"""

from __future__ import annotations

import math

import numpy as np

RESPONSES = ("linear", "sharp", "bspm", "cheby", "none")


def _cheby_coefficients(order: int = 8, phi: float = 1.5) -> np.ndarray:
    """(order + 1,) Chebyshev coefficients of ChebyCF's plateau target ``t(x)`` on [-1, 1]
    (x = 1 - 2 s^2), interpolated at the Chebyshev nodes, as the authors' ChebyFilter.fit does."""
    x = np.round(np.cos((order - np.arange(order + 1)) / order * math.pi), 3)
    target = np.round(np.where(x < 0, 0.5 + 0.5 * np.abs(x) ** phi, 0.5 - 0.5 * np.abs(x) ** phi), 3)
    nodes = np.cos(((order + 1) + 0.5 - np.arange(1, order + 2)) / (order + 1) * math.pi)
    terms = [target, nodes * target]
    for _ in range(2, order + 1):
        terms.append(2 * nodes * terms[-1] - terms[-2])
    c = np.stack(terms[: order + 1]).sum(axis=1) * (2 / (order + 1))
    c[0] /= 2
    return c


_CHEBY = _cheby_coefficients()


def response(name: str, sigma: np.ndarray) -> np.ndarray:
    """h(s^2) of filter ``name`` on singular values ``sigma`` (K,) -> (K,) float64."""
    lam = np.asarray(sigma, np.float64) ** 2
    if name == "linear":
        return lam
    if name == "sharp":
        return lam**2
    if name == "bspm":
        z = 2.5 * lam  # BSPM-EM's sharpening time on Gowalla, as a degree-4 Taylor polynomial
        return lam * (1 - z + z**2 / 2 - z**3 / 6 + z**4 / 24)
    if name == "cheby":
        x = 1 - 2 * lam
        t0, t1 = np.ones_like(x), x
        h = _CHEBY[0] * t0 + _CHEBY[1] * t1
        for c in _CHEBY[2:]:
            t0, t1 = t1, 2 * x * t1 - t0
            h = h + c * t1
        return h
    if name == "none":
        return np.zeros_like(lam)
    raise ValueError(f"spectral filter response {name!r}; expected one of {list(RESPONSES)}")


def user_filter(sigma: np.ndarray, name: str, ideal_weight: float) -> np.ndarray:
    """(K,) float32 ``g(s) = ideal_weight + h(s^2)``, scaled to a largest value of 1 (the scale
    does not change a ranking; it keeps the users' vectors near unit size)."""
    g = float(ideal_weight) + response(name, sigma)
    if name == "none" and ideal_weight <= 0:
        raise ValueError("spectral filter 'none' needs ideal_weight > 0 (the ideal low-pass alone)")
    top = float(np.abs(g).max()) if len(g) else 1.0
    return (g / max(top, 1e-12)).astype(np.float32)


def trend_factor(recent: np.ndarray, total: np.ndarray, power: float) -> np.ndarray:
    """(n,) float32 ``((recent + 1) / (total + 1)) ** power``: an entity engaged by many users
    lately, relative to all its users, is lifted (``power`` 0: no trend, every factor 1).

    recent, total: (n,) distinct users engaging each entity in the trend window / ever (visible).
    """
    if power == 0:
        return np.ones(len(total), np.float32)
    return np.power((np.asarray(recent, np.float64) + 1) / (np.asarray(total, np.float64) + 1), power).astype(np.float32)
