"""LaTeX for the theory: one printer with a fixed symbol mapping, returning strings.

:class:`KvstabLatexPrinter` typesets the symbols of :mod:`kvstab.theory.symbols`
the way the paper writes them (``ŝ`` as ``\\hat{s}``, ``b̄`` as ``\\bar{b}``,
moments as ``\\mathbb{E}[\\cdot]``).  :func:`tex_text` turns the prose of a claim
or a workload spec into LaTeX-safe ASCII, refusing any character it does not
know rather than letting ``pdflatex`` fail later.
"""

from __future__ import annotations

import re
from typing import Any

import sympy as sp
from sympy.printing.latex import LatexPrinter

__all__ = ["KvstabLatexPrinter", "latex", "SYMBOL_LATEX", "tex_text"]

#: the fixed mapping from symbol names to LaTeX
SYMBOL_LATEX: dict[str, str] = {
    "shat": r"\hat{s}",
    "bbar": r"\bar{b}",
    "lambda": r"\lambda",
    "rho": r"\rho",
    "varrho": r"\varrho",
    "kappa": r"\kappa",
    "sigma_s": r"\sigma_{s}",
    "sigma_o": r"\sigma_{o}",
    "E_s": r"\mathbb{E}[s]",
    "E_s2": r"\mathbb{E}[s^{2}]",
    "E_o": r"\mathbb{E}[o]",
    "E_o2": r"\mathbb{E}[o^{2}]",
    "E_so": r"\mathbb{E}[s o]",
    "E_n": r"\mathbb{E}[n]",
    "E_n2": r"\mathbb{E}[n^{2}]",
    "E_sn": r"\mathbb{E}[s n]",
    "E_g": r"\mathbb{E}[g]",
    "E_R": r"\mathbb{E}[(s + o)(n + o)]",
    "C_so": r"\operatorname{Cov}(s, o)",
    "d_0": r"d_{0}",
    "d_1": r"d_{1}",
    "t_p": r"t",
    "t_0": r"t_{0}",
    "mu_new": r"\mu_{\mathrm{new}}",
    "E_gh": r"\mathbb{E}[g_{h}]",
    "S_h": r"S_{h}",
    "N_max": r"N_{\max}",
    "Nbar": r"\bar{N}",
    "pi_t": r"\pi_{t}",
    "E_alive": r"\mathbb{E}[\mathrm{alive}]",
    "E_work": r"\mathbb{E}[\mathrm{work}]",
    "T_C": r"T",
    "Ptilde_t": r"\tilde{P}_{t}",
    "C_free": r"C_{\mathrm{free}}",
    "R_ref": r"R",
    "E_own": r"\mathbb{E}[\mathrm{own}]",
}

# indexed families: lambda_3 -> \lambda_{3}, lp_2 -> l'_{2}, E_g1 -> \mathbb{E}_{1}[g]
_FAMILIES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^lambda_(\d+)$"), r"\\lambda_{\1}"),
    (re.compile(r"^lp_(\d+)$"), r"{l'_{\1}}"),  # braced: l' is already a superscript, so l'^2 needs a group
    (re.compile(r"^l_(\d+)$"), r"l_{\1}"),
    (re.compile(r"^w_(\d+)$"), r"w_{\1}"),
    (re.compile(r"^E_g(\d+)$"), r"\\mathbb{E}_{\1}[g]"),
]


class KvstabLatexPrinter(LatexPrinter):
    """sympy's LaTeX printer with kvstab's fixed symbol mapping."""

    printmethod = "_kvstab_latex"

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        super().__init__(settings or {})

    def _print_Symbol(self, expr: sp.Symbol, style: str = "plain") -> str:
        name = expr.name
        if name in SYMBOL_LATEX:
            return SYMBOL_LATEX[name]
        for pattern, repl in _FAMILIES:
            if pattern.match(name):
                return pattern.sub(repl, name)
        return str(super()._print_Symbol(expr, style=style))


def latex(expr: sp.Basic, **settings: Any) -> str:
    """``expr`` as a LaTeX string (math mode content, no delimiters)."""
    return str(KvstabLatexPrinter(settings).doprint(expr))


_TEXT = {
    "ŝ": r"$\hat{s}$",
    "b̄": r"$\bar{b}$",
    "μ": r"$\mu$",
    "δ": r"$\delta$",
    "λ": r"$\lambda$",
    "ρ": r"$\rho$",
    "ϱ": r"$\varrho$",
    "Λ": r"$\Lambda$",
    "Σ": r"$\Sigma$",
    "∂": r"$\partial$",
    "κ": r"$\kappa$",
    "ε": r"$\varepsilon$",
    "π": r"$\pi$",
    "θ": r"$\theta$",
    "N̄": r"$\bar{N}$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "−": "-",
    "·": r"$\cdot$",
    "…": r"\dots{}",
    "⌈": r"$\lceil$",
    "⌉": r"$\rceil$",
    "∝": r"$\propto$",
    "⇒": r"$\Rightarrow$",
    "²": r"$^2$",
    "₀": r"$_0$",
    "₁": r"$_1$",
    "⟺": r"$\iff$",
    "∓": r"$\mp$",
    "∤": r"$\nmid$",
    "′": "'",
    "→": r"$\to$",
    "×": r"$\times$",
    "—": "---",
    "–": "--",
    "∞": r"$\infty$",
    "≠": r"$\neq$",
    "<": r"$<$",
    ">": r"$>$",
}
_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "|": r"$|$",
}


def tex_text(text: str, *, strict: bool = True) -> str:
    """Prose (claim names, workload specs, paths) as LaTeX-safe ASCII text.

    This is kvstab's one LaTeX escaper (``kvstab.theory.latex.tex_text``): TeX's
    special characters are escaped and the model's symbols (``μ``, ``ŝ``, ``≤``,
    …) become their math forms, so the result compiles with plain ``pdflatex``.
    A character it has no form for raises ``ValueError`` naming it; with
    ``strict=False`` (for text a user supplied, such as a path) it is written
    as its code point instead, e.g. ``é`` as ``[U+00E9]``.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        two = text[i : i + 2]
        if two in _TEXT:  # combining sequences such as "b̄"
            out.append(_TEXT[two])
            i += 2
            continue
        ch = text[i]
        if ch in _TEXT:
            out.append(_TEXT[ch])
        elif ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif ord(ch) < 128:
            out.append(ch)
        elif not strict:
            out.append(f"[U+{ord(ch):04X}]")
        else:
            raise ValueError(f"no LaTeX text form for {ch!r} (U+{ord(ch):04X}) in {text!r}")
        i += 1
    return "".join(out)
