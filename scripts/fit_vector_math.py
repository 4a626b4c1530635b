#!/usr/bin/python3
"""Fits the polynomials of compiler/codegen/cg_math.c and measures the
float32 functions built from them.

For exp, erf and tanh this finds minimax coefficients (a linear Remez
exchange in double precision on the interval and with the weight given
below), rounds them to float32, evaluates the function as the generated
code does (float32 operations, fused multiply-adds) over a dense grid and
random points of its range, and prints the coefficients and the largest
error in ulps of the correctly rounded float32 result (the double-precision
reference rounded).  cg_math.c holds the printed coefficients.

    /usr/bin/python3 scripts/fit_vector_math.py

Needs numpy (Debian's python3-numpy).  Takes a minute.
"""

import math

import numpy as np


def remez(f, basis, w, a, b, iters=40, npts=20000):
    """Coefficients c minimising max |w(x) (f(x) - sum_j c_j basis_j(x))| on
    [a, b]; f, w and the basis functions take numpy arrays."""
    n = len(basis)
    k = np.arange(n + 1)
    xs = (a + b) / 2 - (b - a) / 2 * np.cos(np.pi * k / n)
    grid = np.linspace(a, b, npts)
    best = None
    for _ in range(iters):
        A = np.column_stack([bf(xs) for bf in basis] + [(-1.0) ** k / w(xs)])
        c = np.linalg.solve(A, f(xs))[:n]
        e = w(grid) * (f(grid) - sum(cj * bf(grid) for cj, bf in zip(c, basis)))
        m = np.max(np.abs(e))
        if best is None or m < best[1]:
            best = (c.copy(), m)
        # the next reference: the extremum of each run of one sign
        idx = [0]
        for i in range(1, npts):
            if np.sign(e[i]) != np.sign(e[idx[-1]]):
                idx.append(i)
            elif abs(e[i]) > abs(e[idx[-1]]):
                idx[-1] = i
        if len(idx) < n + 1:
            break
        while len(idx) > n + 1:
            idx.pop(0 if abs(e[idx[0]]) < abs(e[idx[-1]]) else -1)
        xs = grid[idx]
    return [np.float32(x) for x in best[0]]


def fma(a, b, c):
    """float32 fused multiply-add (the product is exact in float64)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def horner(x, coeffs):
    p = np.full_like(x, coeffs[-1])
    for cj in reversed(coeffs[:-1]):
        p = fma(p, x, np.full_like(x, cj))
    return p


def ulps(got, want):
    with np.errstate(over="ignore", invalid="ignore"):
        w32 = want.astype(np.float32)
        spacing = np.maximum(np.spacing(np.abs(w32)).astype(np.float64), 2.0 ** -149)
        e = np.abs(got.astype(np.float64) - want) / spacing
    e[np.isinf(w32) & (got == w32)] = 0
    return e


LN2_HI = np.float32(0.693359375)           # 9 significant bits: k * LN2_HI is exact
LN2_LO = np.float32(math.log(2) - 0.693359375)


def fit_exp():
    # e^r = 1 + r + r^2 (c2 + c3 r + ... + c6 r^4) on |r| <= ln2/2, relative error
    half = math.log(2) / 2 + 1e-4
    c = remez(lambda r: np.expm1(r) - r, [lambda r, j=j: r ** j for j in range(2, 7)], lambda r: np.exp(-r),
              -half, half)
    return [np.float32(1), np.float32(1)] + c


def exp32(x, P):
    x = np.clip(x, np.float32(-104), np.float32(89)).astype(np.float32)
    k = np.rint((x * np.float32(1.4426950408889634)).astype(np.float32)).astype(np.float32)
    r = fma(k, -LN2_HI, x)
    r = fma(k, -LN2_LO, r)
    p = horner(r, P)
    ki = k.astype(np.int32)
    k1 = ki >> 1
    s1 = ((k1 + 127) << 23).astype(np.int32).view(np.float32)
    s2 = ((ki - k1 + 127) << 23).astype(np.int32).view(np.float32)
    with np.errstate(over="ignore"):
        return ((p * s1).astype(np.float32) * s2).astype(np.float32)


def main():
    erf = np.vectorize(math.erf)
    erfc = np.vectorize(math.erfc)
    rng = np.random.default_rng(0)

    P = fit_exp()
    xs = np.concatenate([np.linspace(-104, 89, 2_000_000), rng.uniform(-104, 89, 2_000_000),
                         rng.uniform(-1, 1, 1_000_000)]).astype(np.float32)
    u = ulps(exp32(xs, P), np.exp(xs.astype(np.float64)))
    print("exp  P (degree 0..6):", [repr(float(c)) for c in P])
    print("exp  largest error %.3f ulp" % u.max())

    # erf: a + a Q(a^2) below 0.9; 1 - e^R(a) from 0.9 to 4, R fitted to log erfc with the error it makes in erf
    def q_target(s):
        a = np.sqrt(np.maximum(s, 1e-300))
        return np.where(s < 1e-12, 2 / np.sqrt(np.pi) * (1 - s / 3), erf(a) / a) - 1
    Q = remez(q_target, [lambda s, j=j: s ** j for j in range(6)], lambda s: 1 / (1 + q_target(s)), 0.0, 0.81)
    R = remez(lambda a: np.log(erfc(a)), [lambda a, j=j: a ** j for j in range(9)], lambda a: erfc(a) / erf(a),
              0.9, 4.0)

    def erf32(x):
        a = np.abs(x).astype(np.float32)
        small = fma(horner((a * a).astype(np.float32), Q), a, a)
        big = (np.float32(1) - exp32(horner(np.minimum(a, np.float32(4)), R), P)).astype(np.float32)
        r = np.where(a < np.float32(0.9), small, big)
        return np.copysign(np.where(a >= np.float32(4), np.float32(1), r), x).astype(np.float32)
    xs = np.concatenate([np.linspace(-5, 5, 2_000_000), rng.uniform(-5, 5, 2_000_000),
                         10 ** rng.uniform(-30, 0, 300000)]).astype(np.float32)
    u = ulps(erf32(xs), erf(xs.astype(np.float64)))
    print("erf  Q (degree 0..5):", [repr(float(c)) for c in Q])
    print("erf  R (degree 0..8):", [repr(float(c)) for c in R])
    print("erf  largest error %.3f ulp" % u.max())

    # tanh: a + a s P(s), s = a^2, below 0.9; 1 - 2 / (e^(2a) + 1) above
    def t_target(s):
        a = np.sqrt(np.maximum(s, 1e-300))
        return np.tanh(a) / a - 1
    T = remez(t_target, [lambda s, j=j: s ** (j + 1) for j in range(7)],
              lambda s: np.sqrt(np.maximum(s, 1e-300)) / np.maximum(np.tanh(np.sqrt(s)), 1e-300), 1e-12, 0.81)

    def tanh32(x):
        a = np.abs(x).astype(np.float32)
        s = (a * a).astype(np.float32)
        small = fma((horner(s, T) * s).astype(np.float32), a, a)
        e = exp32((a + a).astype(np.float32), P)
        with np.errstate(over="ignore"):
            big = (np.float32(1) - (np.float32(2) / (e + np.float32(1))).astype(np.float32)).astype(np.float32)
        return np.copysign(np.where(a < np.float32(0.9), small, big), x).astype(np.float32)
    xs = np.concatenate([np.linspace(-9, 9, 2_000_000), rng.uniform(-12, 12, 2_000_000),
                         10 ** rng.uniform(-30, 0, 300000)]).astype(np.float32)
    u = ulps(tanh32(xs), np.tanh(xs.astype(np.float64)))
    print("tanh P (degree 0..6 of s):", [repr(float(c)) for c in T])
    print("tanh largest error %.3f ulp" % u.max())


if __name__ == "__main__":
    main()
