"""The derivation document: a self-contained ``.tex`` file assembled from the
sympy derivations of this package.

Every formula in the document is printed from the expression the code uses
(:mod:`kvstab.theory.g`, :mod:`~kvstab.theory.moments`,
:mod:`~kvstab.theory.stability`, :mod:`~kvstab.theory.provisioning`,
:mod:`~kvstab.theory.wait`) by :func:`kvstab.theory.latex.latex`; every claim is
re-checked by sympy while the document is written and printed with its
verdict.  With a workload and a server it also instantiates the quantities:
the moment formula evaluated on the workload's moments, next to the numeric
code's value, so a reader sees the two agree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import replace

import sympy as sp

from kvstab.errors import KvstabError
from kvstab.theory import fleet as F
from kvstab.theory import g as G
from kvstab.theory import moments as Mo
from kvstab.theory import provisioning as P
from kvstab.theory import sharing as Sh
from kvstab.theory import sharing_lru as Lru
from kvstab.theory import stability as St
from kvstab.theory import wait as Wt
from kvstab.theory.area import expected_g
from kvstab.theory.claims import Claim
from kvstab.theory.latex import latex, tex_text
from kvstab.theory.report import EMPTY_GUARANTEE, Instance, StabilityReport, stability_report
from kvstab.theory.sharing_area import sharing_report
from kvstab.theory.symbols import (
    Eg,
    En,
    En2,
    Eo,
    Eo2,
    Es,
    Es2,
    Eso,
    M,
    N,
    a,
    a_o,
    b,
    b_o,
    bbar,
    shat,
)
from kvstab.workload import Uniform

__all__ = ["CLAIM_GROUPS", "all_claims", "Instance", "derivation_tex", "compile_pdf"]

#: the claims of each part of the theory, in the document's order
CLAIM_GROUPS: dict[str, Callable[[], list[Claim]]] = {
    "g": G.g_claims,
    "E[g]": Mo.moment_claims,
    "stability": St.stability_claims,
    "provisioning": P.provisioning_claims,
    "fleet": F.fleet_claims,
    "sharing": Sh.sharing_claims,
    "sharing below saturation": Lru.lru_claims,
    "WAIT": Wt.wait_claims,
}


def all_claims() -> list[Claim]:
    """Every claim the theory rests on."""
    return [c for group in CLAIM_GROUPS.values() for c in group()]


def _eq(lhs: str, rhs: sp.Basic | str, rel: str = "=") -> str:
    body = f"{lhs} {rel} {rhs if isinstance(rhs, str) else latex(rhs)}"
    # shrink a closed form wider than the line to fit it, never enlarge one
    return (
        "\\[\n\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}"
        f"{{$\\displaystyle {body}$}}\n\\]\n"
    )


_RELATION = {"==": "=", ">=": "\\geq", ">": ">"}


def _claims_table(claims: list[Claim]) -> str:
    """Each claim with its verdict, and the claim itself as mathematics:
    ``lhs <relation> rhs`` printed from the expressions sympy checked."""
    rows = []
    for c in claims:
        verdict = "proved" if c.holds() else "\\textbf{NOT proved}"
        premise = f" \\emph{{(premise: {tex_text(c.premise)})}}" if c.premise else ""
        rows.append(
            f"  \\item {tex_text(c.name)}{premise} --- {verdict}:\n" + _eq(latex(c.lhs), c.rhs, _RELATION[c.relation])
        )
    return "\\begin{itemize}\n" + "\n".join(rows) + "\n\\end{itemize}\n"


def _fmt(v: float | int | None, digits: int = 6) -> str:
    if v is None:
        return "---"
    if isinstance(v, int):
        return f"{v:,}".replace(",", "{,}")
    return f"{v:.{digits}g}"


def _numbers(inst: Instance) -> str:
    rep: StabilityReport = stability_report(inst.workload, inst.params, inst.lam, inst.rho)
    m = rep.moments
    # the moment formula of the document, evaluated on this workload's moments
    vals = {Es: m.Es, Es2: m.Es2, Eo: m.Eo, Eo2: m.Eo2, Eso: m.Eso, En: m.En, En2: m.En2, shat: inst.params.chunk}
    formula_eg = float(Mo.eg_moments(inst.params.g).subs(vals)) if inst.params.block == 1 else None
    formula_mu = float(St.mu_expr().subs({M: inst.params.M, bbar: inst.params.bbar, Eg: rep.E_g}))
    # the paper's continuous form, for comparison (defined for B = 1 only)
    cont_eg = expected_g(inst.workload, replace(inst.params, g="continuous")) if inst.params.block == 1 else None
    # the U(a, b) closed form, when the workload is two independent uniforms
    uniform_eg = None
    w = inst.workload
    if inst.params.block == 1 and isinstance(w.s, Uniform) and isinstance(w.o, Uniform):
        closed = Mo.eg_uniform(inst.params.g).subs(
            {a: w.s.a, b: w.s.b, a_o: w.o.a, b_o: w.o.b, shat: inst.params.chunk}
        )
        uniform_eg = float(closed)
    out = [
        "\\section{The numbers for this workload}\n",
        f"Workload \\texttt{{{tex_text(rep.workload, strict=False)}}}; $M = {_fmt(rep.M)}$ tokens, "
        f"$\\hat{{s}} = {rep.chunk}$, $B = {rep.block}$, $\\bar{{b}} = {_fmt(rep.bbar_s)}$\\,s, "
        f"convention: {rep.g_convention} $g$.\n",
        "\\begin{center}\\begin{tabular}{lr}\n\\hline\nquantity & value \\\\\n\\hline\n",
        f"$\\mathbb{{E}}[s]$, $\\mathbb{{E}}[s^{{2}}]$ & {_fmt(m.Es)}, {_fmt(m.Es2)} \\\\\n",
        f"$\\mathbb{{E}}[o]$, $\\mathbb{{E}}[o^{{2}}]$ & {_fmt(m.Eo)}, {_fmt(m.Eo2)} \\\\\n",
        f"$\\mathbb{{E}}[s o]$, $\\operatorname{{Cov}}(s, o)$, correlation & {_fmt(m.Eso)}, {_fmt(m.cov)}, {_fmt(m.corr(), 3)} \\\\\n",
        f"$\\mathbb{{E}}[n]$, $\\mathbb{{E}}[n^{{2}}]$ & {_fmt(m.En)}, {_fmt(m.En2)} \\\\\n",
        f"$\\mathbb{{E}}[g]$ (numeric code) & {_fmt(rep.E_g, 10)} \\\\\n",
    ]
    if formula_eg is not None:
        out.append(f"$\\mathbb{{E}}[g]$ (moment formula above) & {_fmt(formula_eg, 10)} \\\\\n")
    if uniform_eg is not None:
        out.append(f"$\\mathbb{{E}}[g]$ ($U(a, b)$ closed form above) & {_fmt(uniform_eg, 10)} \\\\\n")
    if cont_eg is not None and inst.params.g == "exact":
        out.append(
            f"$\\mathbb{{E}}[g_{{\\mathrm{{cont}}}}]$ (paper's form), relative gap & {_fmt(cont_eg, 10)}, "
            f"{_fmt((rep.E_g - cont_eg) / rep.E_g, 3)} \\\\\n"
        )
    out += [
        f"$\\mu\\bar{{b}} = M/\\mathbb{{E}}[g]$ (requests per slot) & {_fmt(rep.mu_per_slot)} \\\\\n",
        f"$\\mu = M/(\\bar{{b}}\\,\\mathbb{{E}}[g])$ (requests/s) & {_fmt(rep.mu_per_s)} \\\\\n",
        f"$\\mu$ from the symbolic formula & {_fmt(formula_mu)} \\\\\n",
        f"$S = \\operatorname{{ess\\,sup}}(s + o)$ & {_fmt(rep.ess_sup_total)} \\\\\n",
        f"$\\delta = S/M$ & {_fmt(rep.delta)} \\\\\n",
        f"$\\mu(1 - \\delta)$ (requests/s) & {_fmt(rep.guarantee_per_s) if rep.guarantee_per_s is not None else 'none'} \\\\\n",
        f"reserve limit (requests/s) & {_fmt(rep.reserve_limit_per_s)} \\\\\n",
    ]
    if rep.lam_per_s is not None:
        out += [
            f"replicas for $\\lambda = {_fmt(rep.lam_per_s)}$, $\\rho = {_fmt(rep.rho)}$ & {_fmt(rep.replicas)} \\\\\n",
            f"replicas that guarantee stability & {_fmt(rep.guarantee_replicas) if rep.guarantee_replicas else 'none'} \\\\\n",
        ]
    out.append("\\hline\n\\end{tabular}\\end{center}\n")
    if rep.guarantee_empty:
        out.append(f"\\textbf{{Note:}} {tex_text(EMPTY_GUARANTEE)}.\n")
    return "".join(out)


_PREAMBLE = r"""\documentclass[11pt]{article}
\usepackage{amsmath,amssymb,amsthm}
\usepackage{graphicx}
\usepackage[margin=2.5cm]{geometry}
\newtheorem{theorem}{Theorem}
\newtheorem{lemma}{Lemma}
\title{Stability of LLM inference under KV-cache limits:\\ the derivations of \texttt{kvstab.theory}}
\author{generated by \texttt{kvstab derive}}
\date{}
\begin{document}
\maketitle
"""


def _section_definitions() -> str:
    parts: list[str] = []
    parts.append(r"""\section{Definitions}
Time is slotted; one slot is one engine iteration of $\bar{b}$ seconds. A request has prompt length
$s \geq 1$ and output length $o \geq 1$, drawn i.i.d.\ from a law $p(s, o)$. Prefill runs in
$n = \lceil s/\hat{s} \rceil$ chunks of $\hat{s}$ tokens; after chunk $c$ the request holds
$\min(c\hat{s}, s)$ tokens, after decode step $j$ it holds $s + j$. Each slot charges what a request holds
after the slot's work, and the memory in use never exceeds $M$ tokens. The \emph{lifetime memory area}
is the sum of what a request holds over its $n + o$ slots:
""")
    parts.append(_eq("g(s, o)", G.defining_sum()))
    return "".join(parts)


def _section_lifetime_area() -> str:
    parts: list[str] = []
    lo_w, hi_w = G.block_tail_bounds(N)
    lo_g, hi_g = G.g_blocks_bounds()
    parts.append(r"""\section{The lifetime area $g$ and its closed forms}
\begin{lemma}[split of the prefill sum]
Write $s = (n - 1)\hat{s} + r$ with $1 \leq r \leq \hat{s}$. Chunks $c \leq n - 1$ hold $c\hat{s} < s$
and chunk $n$ holds $s$, since $n\hat{s} \geq s$. Hence
""")
    parts.append(_eq(r"\sum_{c=1}^{n} \min(c \hat{s}, s)", G.prefill_area_exact()))
    parts.append(r"""\end{lemma}
The decode steps add $\sum_{j=1}^{o} (s + j)$, closed by sympy:
""")
    parts.append(_eq(r"\sum_{j=1}^{o} (s + j)", G.decode_area()))
    parts.append("The \\emph{exact} form, valid for every $s$:\n")
    parts.append(_eq("g_{\\mathrm{exact}}", G.g_exact_expr()))
    parts.append(
        "When $\\hat{s} \\mid s$ every chunk, the last included, holds $c\\hat{s}$ and $n = s/\\hat{s}$; "
        "this gives the paper's \\emph{continuous} form:\n"
    )
    parts.append(_eq("g_{\\mathrm{cont}}", G.g_continuous_expr()))
    parts.append("The two differ by (with $s = (n-1)\\hat{s} + r$):\n")
    parts.append(_eq("g_{\\mathrm{exact}} - g_{\\mathrm{cont}}", G.continuous_gap()))
    parts.append(
        "which vanishes exactly when $r = \\hat{s}$ (i.e.\\ $\\hat{s} \\mid s$), is never negative, and is bounded by\n"
    )
    parts.append(_eq("0 \\leq g_{\\mathrm{exact}} - g_{\\mathrm{cont}}", G.continuous_gap_bound(), "\\leq"))
    parts.append(
        "so the continuous form under-counts the area by less than one slot's worth of the prompt, $s$.\n\n"
        "Without chunking ($\\hat{s} \\geq s$, $n = 1$) the exact form is\n"
    )
    parts.append(_eq("g", G.g_wait_expr()))
    parts.append(r"""\subsection*{Block-granular allocation}
vLLM allocates KV memory in blocks of $B$ tokens, so a holding of $x$ tokens costs $B\lceil x/B\rceil$.
Summing over $x = 1, \dots, N$ with $N = qB + L$, $0 \leq L < B$ (block $k$ costs $kB$ for each of its $B$ tokens):
""")
    parts.append(_eq("F(N) = \\sum_{x=1}^{N} B \\left\\lceil \\frac{x}{B} \\right\\rceil", G.block_prefix()))
    parts.append(r"""The last prefill chunk and the decode steps hold $o + 1$ consecutive counts $s, s+1, \dots, s+o$,
so the exact block-granular area is
\[
g_B(s, o) = \sum_{c=1}^{n-1} B\left\lceil \frac{c\hat{s}}{B} \right\rceil + F(s + o) - F(s - 1),
\]
which is what the numeric code evaluates (vectorised). The rounding waste of $N = qB + L$ consecutive counts lies between
""")
    parts.append(_eq("W_{\\min}", lo_w))
    parts.append("and\n")
    parts.append(_eq("W_{\\max}", hi_w))
    parts.append(
        "both attained by some residue of the first count. With $B \\mid \\hat{s}$ (vLLM: $\\hat{s} = 512$, $B = 16$) "
        "the full chunks hold whole blocks, and with $L = (o + 1) \\bmod B$:\n"
    )
    parts.append(_eq("g_B(s, o)", lo_g, "\\geq") + "and\n" + _eq("g_B(s, o)", hi_g, "\\leq"))
    parts.append(_claims_table(G.g_claims()))
    return "".join(parts)


def _section_expected_area() -> str:
    parts: list[str] = []
    mo1, mo2 = Mo.geometric_moments()
    us1, us2 = Mo.uniform_moments(a, b)
    cc1, cc2 = Mo.chunk_count_sums()
    parts.append(r"""\section{The expected area $\mathbb{E}[g]$}
The only cross term of $g$ is $s o$, so by linearity (exact form, in the moments of $s$, $o$ and $n$):
""")
    parts.append(_eq("\\mathbb{E}[g]", Mo.eg_moments("exact")))
    parts.append(
        "and for the continuous form, in $\\mathbb{E}[s], \\mathbb{E}[s^2], \\mathbb{E}[o], \\mathbb{E}[o^2], \\mathbb{E}[so]$ alone:\n"
    )
    parts.append(_eq("\\mathbb{E}[g_{\\mathrm{cont}}]", Mo.eg_moments("continuous")))
    parts.append(
        "With the covariance explicit, $\\mathbb{E}[so] = \\mathbb{E}[s]\\mathbb{E}[o] + \\operatorname{Cov}(s, o)$:\n"
    )
    parts.append(_eq("\\mathbb{E}[g]", Mo.eg_covariance("exact")))
    parts.append(
        "so a positive correlation of prompt and output lengths raises $\\mathbb{E}[g]$ one for one.\n\n"
        "\\paragraph{Discrete uniform $U(a, b)$.} By summation:\n"
    )
    parts.append(_eq("\\mathbb{E}[X]", us1) + _eq("\\mathbb{E}[X^{2}]", us2))
    parts.append("For the exact form the chunk counts of $x = 1, \\dots, N$, $N = q\\hat{s} + L$, sum to\n")
    parts.append(_eq("\\sum_{x=1}^{N} n(x)", cc1) + _eq("\\sum_{x=1}^{N} n(x)^{2}", cc2))
    parts.append(
        "and $\\mathbb{E}[n]$, $\\mathbb{E}[n^2]$ under $U(a, b)$ are differences of these at $b$ and $a - 1$.\n\n"
        "\\paragraph{Fixed lengths.} $\\mathbb{E}[g] = g(s, o)$.\n\n"
        "\\paragraph{Geometric output} $o \\sim \\mathrm{Geom}(p)$ conditioned on $o \\leq K$:\n"
    )
    parts.append(_eq("\\mathbb{E}[o]", mo1) + _eq("\\mathbb{E}[o^{2}]", mo2))
    parts.append("\\paragraph{Correlated uniforms} with correlation coefficient $\\varrho$ (continuous form):\n")
    parts.append(_eq("\\mathbb{E}[g]", Mo.eg_correlated_uniform("continuous")))
    parts.append("\\paragraph{Empirical joint laws} (a trace's rows) are averaged numerically, row by row.\n")
    parts.append(_claims_table(Mo.moment_claims()))
    return "".join(parts)


def _section_service_rate() -> str:
    parts: list[str] = []
    sens = St.sensitivities("continuous")
    parts.append(r"""\section{Service rate $\mu$ and the constant $\delta$}
""")
    parts.append(
        _eq("\\mu", St.mu_expr()) + _eq("\\delta", St.delta_expr()) + _eq("\\mu(1 - \\delta)", St.guarantee_expr())
    )
    parts.append(
        "with $S = \\operatorname{ess\\,sup}(s + o)$. The reserve policy holds each request's peak for all its slots; its limit is\n"
    )
    parts.append(_eq("\\lambda_{\\mathrm{reserve}}", St.reserve_limit_expr()))
    parts.append(
        "\\paragraph{Sensitivities} (continuous form): $\\partial\\mu/\\partial M$, $\\partial\\mu/\\partial\\hat{s}$, "
        "$\\partial\\mu/\\partial\\bar{b}$, $\\partial\\mu/\\partial\\operatorname{Cov}(s, o)$ and the elasticities:\n"
    )
    for key, sym in (
        ("d_mu_d_M", "M"),
        ("d_mu_d_shat", "\\hat{s}"),
        ("d_mu_d_bbar", "\\bar{b}"),
        ("d_mu_d_cov", "\\operatorname{Cov}(s, o)"),
    ):
        parts.append(_eq(f"\\frac{{\\partial \\mu}}{{\\partial {sym}}}", sens[key]))
    for key, sym in (("elasticity_M", "M"), ("elasticity_shat", "\\hat{s}"), ("elasticity_bbar", "\\bar{b}")):
        parts.append(_eq(f"\\varepsilon_{{{sym}}}", sens[key]))
    return "".join(parts)


def _section_theorems() -> str:
    parts: list[str] = []
    crit = St.critical_rates()
    fl = St.foster_lyapunov()
    parts.append(r"""\section{The two theorems and the drift argument}
Let $V(t)$ be the remaining memory area of all requests in the system: the full $g$ of a waiting request,
the unserved part $g - A$ of an active one ($A$ = area served so far). In one slot each request changes $V$ as follows
(charged $m$ = what it holds after the slot's work; a preempted request does no work and its served area $A$ is wasted):
""")
    parts.append(_claims_table(St.lyapunov_cases()))
    parts.append(
        r"""Summing over the requests gives the per-slot identity
\[
V' = V + \sum_{\text{arrivals}} g - \text{used} + \text{wasted}.
\]
With Poisson arrivals of rate $\lambda$ per second, $\mathbb{E}[\sum_{\text{arrivals}} g] = \lambda\bar{b}\,\mathbb{E}[g]$ per slot.
\begin{theorem}[instability]
A slot uses at most $M$, so under any policy $\mathbb{E}[\Delta V] \geq """
        + latex(St.drift_lower())
        + r"""$; $V$ (and the queue) grows without bound when
"""
        + f"$\\lambda > {latex(crit['instability'])} = \\mu$."
        + r"""
\end{theorem}
\begin{theorem}[stability]
A work-conserving, non-preempting policy with a long queue uses more than $M - S$ in every slot (otherwise the head
would fit), so $\mathbb{E}[\Delta V] \leq """
        + latex(St.drift_upper())
        + r"""$. Foster--Lyapunov: outside the finite set of
short queues $\mathbb{E}[\Delta V] \leq -\varepsilon$ with
"""
        + f"$\\varepsilon = {latex(fl['epsilon'])}$, and $\\varepsilon > 0$ exactly when ${latex(fl['region'])}$, "
        + r"""
i.e.\ $\lambda < """
        + latex(crit["stability"])
        + r""" = \mu(1 - \delta)$; the chain is then positive recurrent.
\end{theorem}
"""
    )
    parts.append(_claims_table([c for c in St.stability_claims() if c not in St.lyapunov_cases()]))
    return "".join(parts)


def _section_provisioning() -> str:
    parts: list[str] = []
    mix, _, _ = P.mixture_mu_expr(2)
    parts.append(r"""\section{Provisioning}
Data-parallel replicas for load $\lambda$ at target utilisation $\rho \in (0, 1]$, and the number that meets the
stability theorem's condition:
""")
    parts.append(
        _eq("N(\\lambda, \\rho)", P.replicas_expr()) + _eq("N_{\\mathrm{guarantee}}", P.guarantee_replicas_expr())
    )
    parts.append(
        "A tensor-parallel group of $t$ GPUs with $H$ bytes each for weights and KV, weights $W$ and $\\kappa$ KV bytes per token "
        "is one worker with\n"
    )
    parts.append(_eq("M_t", P.tp_capacity_expr()))
    parts.append(
        "and its own measured $\\bar{b}_t$; the group count is $N$ computed with $M_t$, $\\bar{b}_t$, and the GPU count is $tN$.\n\n"
        "\\paragraph{Piecewise-stationary mixtures.} If phase $k$ brings a fraction $w_k$ of the requests, the memory-area balance "
        "$\\lambda\\bar{b}\\sum_k w_k\\mathbb{E}_k[g] = M$ at saturation gives\n"
    )
    parts.append(_eq("\\mu_{\\mathrm{mix}}", mix))
    parts.append(
        "(a request-weighted harmonic mean of the phases' $\\mu_k$), assuming one $\\bar{b}$ for all phases, "
        "no area wasted at phase changes, and phases long enough for the balance to hold.\n"
    )
    parts.append(_claims_table(P.provisioning_claims()))
    return "".join(parts)


def _section_wait() -> str:
    parts: list[str] = []
    parts.append(r"""\section{Cross-check with the WAIT fluid model}
Ao, Luo, Simchi-Levi and Wang (arXiv 2504.11320) prefill a prompt in one iteration, so a request of type $(l, l')$ has
$g(l, l') = (l' + 1)(l + l'/2)$; an iteration with $C$ tokens in memory takes $d_0 + d_1 C$ seconds, and their fluid
region is $\Lambda = \sum_t \lambda_t g(l_t, l'_t) \leq C/(d_0 + d_1 C)$. At saturation $C = M$ and
$\bar{b} = d_0 + d_1 M$, and the region is exactly $\lambda < \mu$:
""")
    parts.append(_claims_table(Wt.wait_claims()))
    return "".join(parts)


def _section_fleet() -> str:
    n = 3
    mus, _, ps = F.fleet_symbols(n)
    parts = [
        r"""\section{Fleets: replicas behind a router}
A fleet is $N$ independent replicas; replica $i$ has its own $M_i$, $\bar{b}_i$, $\hat{s}_i$, $B_i$, hence its own
$\mu_i$ and $\delta_i$. The router is \emph{size-blind}: it never looks at $s$ or $o$, so every replica sees the
workload's own law. Replica $i$ receives the long-run rate $\lambda_i$, $\sum_i \lambda_i = \lambda$.
\begin{theorem}[any router]
Replica $i$'s instability theorem uses only its mean arrival rate, so it is unstable when $\lambda_i > \mu_i$.
No size-blind router is stable when
""",
        f"$\\lambda > {latex(F.ideal_rate_expr(n))}$ (here $N = {n}$).\n\\end{{theorem}}\n",
        r"""\begin{theorem}[static random split]
Sending each request to replica $i$ with probability $p_i$, independently, thins the Poisson stream: replica $i$
is the single-server model with arrival rate $\lambda p_i$. The split is unstable when $\lambda p_i > \mu_i$ for
some $i$, i.e.\ above
""",
        _eq(r"\lambda^{*}(p)", F.split_rate_expr(n)),
        "and stable (for replica policies that meet the stability theorem's premise) below\n",
        _eq(r"\lambda_{\mathrm{guar}}(p)", F.split_guarantee_expr(n)),
        r"""\end{theorem}
Weighted round-robin gives each replica the same long-run rate $\lambda p_i$, so the first bound holds for it as
stated; its second needs the drift argument over one round of the router, taken here as a premise, not proved.

\paragraph{The optimal split} is proportional to the rates,
""",
        "".join(_eq(f"p_{{{i + 1}}}", e) for i, e in enumerate(F.optimal_split_expr(n))),
        "which makes every $\\mu_i/p_i$ equal to $\\sum_j \\mu_j$; no split does better, since\n",
        _eq(
            "\\sum_i p_i \\frac{\\mu_i}{p_i} = "
            + latex(sp.Add(*(p_ * sp.UnevaluatedExpr(m / p_) for m, p_ in zip(mus, ps)))),
            F.ideal_rate_expr(n),
        ),
        "is a $p$-weighted mean of the ratios, so their minimum is at most $\\sum_i \\mu_i$.\n\n"
        "\\paragraph{Round-robin} ($p_i = 1/N$) is critical at\n",
        _eq("\\lambda^{*}_{\\mathrm{RR}}", F.round_robin_rate_expr(n)),
        "and leaves unused the fraction\n",
        _eq("1 - \\frac{\\lambda^{*}_{\\mathrm{RR}}}{\\sum_i \\mu_i}", F.round_robin_loss_expr(n)),
        "of the fleet's capacity (two replicas with $\\mu_1 = 2\\mu_2$: $2\\mu_2$ against $3\\mu_2$).\n\n"
        "\\paragraph{Provisioning} a heterogeneous fleet at utilisation $\\rho$ with the optimal split needs the "
        "capacity margin\n",
        _eq("\\sum_i \\mu_i - \\frac{\\lambda}{\\rho}", F.fleet_provisioning_expr(n)),
        "to be non-negative, and $\\sum_i \\mu_i(1 - \\delta_i) > \\lambda$ for the guarantee.\n",
        _claims_table(F.fleet_claims()),
    ]
    return "".join(parts)


def _section_sharing() -> str:
    ceil = Sh.ceilings_expr()
    share = "\\mu_{\\mathrm{share}}"
    parts = [
        r"""\section{Prefix caching: a shared prompt held once}
With automatic prefix caching a request whose prompt begins with $P$ tokens that another request wrote
\emph{hits} their full blocks; a hit on the whole prompt recomputes its last token. Its hit is
""",
        _eq("h", Sh.hit_expr()),
        r"""tokens, a multiple of $B$. Its prefill starts at $h$, and of the $B\lceil x/B\rceil$ tokens it holds with
$x$ computed, the $h$ hit tokens are blocks held once for all the requests that share them. Since $B \mid h$,
what it holds \emph{net of the shared part} is what a request of prompt $s - h$ holds without sharing, so its
net lifetime area is $g_h(s, o) = g(s - h, o)$:
""",
        _eq("g_h(s, o)", Sh.net_area_expr()),
        "with $n = \\lceil (s - h)/\\hat{s}\\rceil$ here. In the continuous form one request no longer holds\n",
        _eq("g(s, o) - g(s - h, o)", Sh.saved_area_expr()),
        "and with one hit $h$ for all requests the expected net area, in the moments, is\n",
        _eq("\\mathbb{E}[g_{h}]", Sh.eg_net_moments()),
        r"""\paragraph{$\mu$ and $\delta$ with sharing.} Let $H$ be the tokens of the shared part held once (the
full blocks of the shared prompt; for tenants, the tenants' prompts that a running request references, each
with probability """,
        f"${latex(Sh.referenced_expr())}$ among $\\bar{{N}}$ running requests). ",
        "While the shared part is held a slot serves at most $M - H$ of net area, so the drift is at least\n",
        _eq("\\mathbb{E}[\\Delta V_{h}]", Sh.drift_lower_share(), "\\geq"),
        "which vanishes at\n",
        _eq(share, Sh.mu_share_expr()),
        _eq("\\delta_{\\mathrm{share}}", Sh.delta_share_expr()),
        _eq(f"{share}(1 - \\delta_{{\\mathrm{{share}}}})", Sh.guarantee_share_expr()),
        "with $S_{h} = \\operatorname{ess\\,sup} B\\lceil (s + o - h)/B\\rceil$. Beside the paper's $\\mu$:\n",
        _eq(f"\\frac{{{share}}}{{\\mu}}", Sh.gain_expr()),
        r"""\paragraph{Ceilings.} A server with a cap $N_{\max}$ on running requests and a token budget $\beta$ per
slot has two more ceilings (Little's law; the token balance), and the saturated rate of a rule that keeps the
binding resource full is the least of
""",
        "".join(_eq(f"\\text{{{tex_text(name)}}}", expr) for name, expr in ceil.items()),
        r"""\paragraph{A bound for any reuse pattern.} Counted back from its last prefill slot, a request that computes
at most $\hat{s}$ of its own $u$ tokens per slot holds at least $u, u - \hat{s}, \dots$, so its own area is at
least
""",
        _eq("g^{-}(u, o)", Sh.backward_area_expr()),
        r"""whatever the policy, its preemptions (in every run its progress rises by at most $\hat{s}$ per running
slot) and the token budget. Its blocks past the longest prefix it can share, $\hat{h}$, are its own, distinct
from every other request's, and a slot holds at most $M$: completions per slot are at most
$M/\mathbb{E}[g^{-}(s - \hat{h}, o)]$ under any policy.
""",
        _claims_table(Sh.sharing_claims()),
    ]
    return "".join(parts)


def _section_sharing_lru() -> str:
    pr = Lru.chat_probabilities_expr()
    parts = [
        r"""\section{Prefix caching below saturation: the free queue as an LRU cache}
vLLM's free queue is a list by \emph{release} time: a block whose last reference ends joins the tail, an
allocation takes the head, a hit takes a block out. A block released at $\tau$ is still cached at $\tau + a$
about when $a < T$, Che's characteristic time. \paragraph{Tenants.} With $\lambda\bar{b}$ arrivals per slot,
running requests hold $\lambda\bar{b}\,\mathbb{E}[g_{h}]$ of net area and the referenced prompts
$R = \sum_t \tilde{P}_{t} r_t$ ($\tilde{P}_{t} = B\lfloor P_t/B\rfloor$, $r_t$ the referenced probability,
$\bar{N} = \lambda\bar{b}\,\mathbb{E}[\mathrm{alive}]$), so the free queue holds
""",
        _eq("C_{\\mathrm{free}}", Lru.free_tenants_expr()),
        r"""tokens: the own blocks of every request finished within the last $T$ (never asked for again) and each
tenant's prompt that no running request references and whose last release is younger than $T$ (a tenant's
idle periods are exponential, so is their age). Per tenant, with the own blocks' flow:
""",
        _eq("\\text{occupancy}_t(T)", Lru.occupancy_tenants_expr()),
        r"""and $T$ solves $\lambda\bar{b}\,\mathbb{E}[\mathrm{own}]T + \sum_t (\cdots) = C_{\mathrm{free}}$; the left side rises
strictly in $T$ from 0 to $\infty$, so the root is unique. Tenant $t$ hits when its prompt is referenced or
cached though unreferenced:
""",
        _eq("q_t", Lru.tenant_hit_expr()),
        "and with a Poisson number of its running requests\n",
        _eq("q_t", Lru.tenant_hit_poisson_expr()),
        r"""At saturation $C_{\mathrm{free}} = 0$, so $T = 0$ and $q_t = r_t$: the saturated fixed point exactly.
\paragraph{Conversations.} Turn $k$ arrives $A \sim \mathrm{Exp}(\theta)$ slots after turn $k-1$'s arrival.
Turn $k-1$ (prompt $S$, its own hit $h_0$, prefill $c$ slots, alive $D$ slots, $L$ full-block tokens written
at its end) is running, finished and cached, or evicted with probabilities
""",
        "".join(_eq(f"P(\\text{{{name}}})", expr) for name, expr in pr.items()),
        "While it runs, turn $k$ hits what it has written (its prefill, then one token a slot; the block "
        "rounding taken as its mean):\n",
        _eq("\\mathbb{E}[x(A); A < D]", Lru.chat_running_hit_expr()),
        _eq("\\mathbb{E}[h]", Lru.chat_hit_expr()),
        "The hit area held once while both turns run is\n",
        _eq("\\mathbb{E}[x(A)(D - A); A < D]", Lru.chat_overlap_expr()),
        "and a released chain spends in the free queue, when a next turn follows,\n",
        _eq("\\text{occupancy}", Lru.chat_release_occupancy_expr()),
        r"""token-slots ($L\,T$ for a conversation's last turn). At saturation $T = 0$: only a running predecessor is hit.
""",
        _claims_table(Lru.lru_claims()),
    ]
    return "".join(parts)


#: the document's sections, in order
SECTIONS: tuple[Callable[[], str], ...] = (
    _section_definitions,
    _section_lifetime_area,
    _section_expected_area,
    _section_service_rate,
    _section_theorems,
    _section_sharing,
    _section_sharing_lru,
    _section_provisioning,
    _section_fleet,
    _section_wait,
)


def _fleet_numbers(rep: F.FleetReport) -> str:
    def rate(x: float | None) -> str:
        return "none ($\\delta \\geq 1$)" if x is None else _fmt(x)

    def vec(xs: tuple[float, ...] | None) -> str:
        return "none" if xs is None else ", ".join(_fmt(x, 4) for x in xs)

    rows = [
        ("replicas $N$", _fmt(len(rep.mus))),
        ("$\\mu_i$ (requests/s)", vec(rep.mus)),
        ("$\\delta_i$", vec(rep.deltas)),
        ("$\\sum_i \\mu_i$ (any router, critical)", rate(rep.ideal_rate)),
        ("optimal split $p_i \\propto \\mu_i$", vec(rep.optimal_split)),
        ("guarantee split $p_i \\propto \\mu_i(1 - \\delta_i)$", vec(rep.guarantee_split)),
        ("$\\sum_i \\mu_i(1 - \\delta_i)$ (guarantee split, stable below)", rate(rep.optimal_guarantee)),
        ("$N \\min_i \\mu_i$ (round-robin, critical)", rate(rep.round_robin_rate)),
        ("round-robin, stable below", rate(rep.round_robin_guarantee)),
        ("capacity round-robin leaves unused", _fmt(rep.round_robin_loss, 4)),
    ]
    body = "".join(f"{k} & {v} \\\\\n" for k, v in rows)
    return (
        "\\section{The numbers for this fleet}\n"
        "\\begin{center}\\begin{tabular}{lr}\n\\hline\nquantity & value \\\\\n\\hline\n"
        + body
        + "\\hline\n\\end{tabular}\\end{center}\n"
    )


def _sharing_numbers(inst: Instance) -> str:
    """The sharing quantities of the instance, when its workload has a prefix law with a closed form."""
    rep = sharing_report(inst.workload, inst.params)
    if rep is None:
        return ""
    b = inst.params.bbar
    rows = [
        ("prefix law", tex_text(rep.law)),
        ("$\\mathbb{E}[g]$ (paper) / $\\mathbb{E}[g_{h}]$ (net of the shared part)",
         f"{_fmt(rep.E_g)} / {_fmt(rep.E_g_net)}"),
        ("$H$ (tokens held once)", _fmt(rep.held_once)),
        ("$\\mu$ / $\\mu_{\\mathrm{share}}$ (requests/s)", f"{_fmt(rep.mu_per_slot / b)} / {_fmt(rep.mu_share_per_s)}"),
        ("$\\delta_{\\mathrm{share}}$", _fmt(rep.delta_share)),
        ("$\\mu_{\\mathrm{share}}(1 - \\delta_{\\mathrm{share}})$", _fmt(rep.guarantee_share_per_s)),
        ("least ceiling", tex_text(rep.binding)),
    ]
    body = "".join(f"{k} & {v} \\\\\n" for k, v in rows)
    return (
        "\\section{The numbers with prefix caching}\n"
        "\\begin{center}\\begin{tabular}{lr}\n\\hline\nquantity & value \\\\\n\\hline\n"
        + body
        + "\\hline\n\\end{tabular}\\end{center}\n"
    )


def derivation_tex(instance: Instance | None = None, fleet: F.FleetReport | None = None) -> str:
    """The derivation document as a string (pure ASCII; compiles with ``pdflatex``).

    One function per section; ``instance`` appends the numbers of a workload and
    a server, ``fleet`` those of a fleet (:func:`kvstab.theory.fleet.fleet_report`).
    """
    sections = [section() for section in SECTIONS]
    if instance is not None:
        sections.append(_numbers(instance))
        sections.append(_sharing_numbers(instance))
    if fleet is not None:
        sections.append(_fleet_numbers(fleet))
    text = _PREAMBLE + "".join(sections) + "\\end{document}\n"
    # pdflatex without extra packages reads ASCII only; fail here, not in TeX
    bad = sorted({ch for ch in text if ord(ch) > 127})
    if bad:
        raise KvstabError(
            f"the derivation document has non-ASCII characters {bad!r}; extend kvstab.theory.latex.tex_text"
        )
    return text


def compile_pdf(tex_path: str, timeout_s: float = 120.0) -> str:
    """Compile ``tex_path`` with ``pdflatex`` into a PDF beside it; returns the PDF's path.

    Raises :class:`KvstabError` when ``pdflatex`` is absent or the compile fails
    (with the first TeX error line).
    """
    exe = shutil.which("pdflatex")
    if exe is None:
        raise KvstabError("pdflatex not found; install TeX (Debian: texlive-latex-base) or omit --pdf")
    out_dir = os.path.dirname(os.path.abspath(tex_path))
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run(
            [exe, "-interaction=nonstopmode", "-halt-on-error", f"-output-directory={work}", os.path.abspath(tex_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=work,
        )
        name = os.path.splitext(os.path.basename(tex_path))[0] + ".pdf"
        built = os.path.join(work, name)
        if proc.returncode != 0 or not os.path.isfile(built):
            err = next((ln for ln in proc.stdout.splitlines() if ln.startswith("!")), f"exit status {proc.returncode}")
            raise KvstabError(f"pdflatex failed on {tex_path}: {err}")
        dest = os.path.join(out_dir, name)
        shutil.copyfile(built, dest)
    return dest
