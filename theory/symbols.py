"""The sympy symbols of the theory, each with the assumptions the model gives it.

Every derivation in :mod:`kvstab.theory` draws its symbols from here, so that a
symbol means one thing everywhere and the LaTeX printer
(:mod:`kvstab.theory.latex`) has one fixed mapping to typeset them.  The
assumptions matter: sympy closes ``Σ_{c=1}^{n} c·ŝ`` only because it knows
``n`` is a non-negative integer, and proves ``exact − continuous ≥ 0`` only
because it knows ``ŝ − r`` is non-negative.
"""

from __future__ import annotations

import sympy as sp

__all__ = [
    "s",
    "o",
    "shat",
    "n",
    "r",
    "c",
    "j",
    "k",
    "t",
    "B",
    "q",
    "L",
    "M",
    "bbar",
    "lam",
    "rho",
    "S",
    "Es",
    "Es2",
    "Eo",
    "Eo2",
    "Eso",
    "En",
    "En2",
    "Esn",
    "cov",
    "corr",
    "sigma_s",
    "sigma_o",
    "a",
    "b",
    "a_o",
    "b_o",
    "p",
    "K",
    "d0",
    "d1",
    "Eg",
    "x",
    "i",
    "N",
]

# lengths and the chunk: integers >= 1
s = sp.Symbol("s", integer=True, positive=True)
o = sp.Symbol("o", integer=True, positive=True)
shat = sp.Symbol("shat", integer=True, positive=True)
#: chunks of a prompt, n = ⌈s/ŝ⌉ (positive because s ≥ 1)
n = sp.Symbol("n", integer=True, positive=True)
#: size of the last chunk, s = (n − 1)·ŝ + r with 1 ≤ r ≤ ŝ
r = sp.Symbol("r", integer=True, positive=True)
# summation indices and slack variables (non-negative integers)
c = sp.Symbol("c", integer=True, positive=True)
j = sp.Symbol("j", integer=True, positive=True)
i = sp.Symbol("i", integer=True, positive=True)
x = sp.Symbol("x", integer=True, positive=True)
k = sp.Symbol("k", integer=True, nonnegative=True)
t = sp.Symbol("t", integer=True, nonnegative=True)
# KV block size B and the quotient/remainder of a length by B
B = sp.Symbol("B", integer=True, positive=True)
q = sp.Symbol("q", integer=True, nonnegative=True)
L = sp.Symbol("L", integer=True, nonnegative=True)
N = sp.Symbol("N", integer=True, nonnegative=True)
# the server
M = sp.Symbol("M", positive=True)
bbar = sp.Symbol("bbar", positive=True)
lam = sp.Symbol("lambda", positive=True)
rho = sp.Symbol("rho", positive=True)
#: ess sup(s + o)
S = sp.Symbol("S", positive=True)
# moments of the workload
Es = sp.Symbol("E_s", positive=True)
Es2 = sp.Symbol("E_s2", positive=True)
Eo = sp.Symbol("E_o", positive=True)
Eo2 = sp.Symbol("E_o2", positive=True)
Eso = sp.Symbol("E_so", positive=True)
En = sp.Symbol("E_n", positive=True)
En2 = sp.Symbol("E_n2", positive=True)
Esn = sp.Symbol("E_sn", positive=True)
Eg = sp.Symbol("E_g", positive=True)
cov = sp.Symbol("C_so", real=True)
corr = sp.Symbol("varrho", real=True)
sigma_s = sp.Symbol("sigma_s", nonnegative=True)
sigma_o = sp.Symbol("sigma_o", nonnegative=True)
# distribution parameters: U(a, b) for s, U(a_o, b_o) for o, geometric p truncated at K
a = sp.Symbol("a", integer=True, positive=True)
b = sp.Symbol("b", integer=True, positive=True)
a_o = sp.Symbol("a_o", integer=True, positive=True)
b_o = sp.Symbol("b_o", integer=True, positive=True)
p = sp.Symbol("p", positive=True)
K = sp.Symbol("K", integer=True, positive=True)
# WAIT's batch-time model b = d0 + d1·(tokens in memory)
d0 = sp.Symbol("d_0", positive=True)
d1 = sp.Symbol("d_1", positive=True)
