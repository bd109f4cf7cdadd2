"""The audit's report in ``DIR``: ``report.md``, a self-contained
``report.html`` (plots inline as base64 PNG, no external resource),
``report.json`` (schema ``kvstab.audit/1``, documented in ``docs/audit.md``),
``report.tex`` (a section to paste into a paper) and the PNG plots.

Every report is rendered from :meth:`AuditResult.to_json` plus the plots, so
the four formats state the same numbers.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from kvstab.audit.audit import AuditResult
from kvstab.audit.properties import short_name

__all__ = ["write_report", "summary_rows", "nearest_below", "markdown", "replays", "scope_line"]



def _scope(inv: dict[str, Any]) -> str:
    """What the invariant's verdict covers (the audit's ``scope`` field; reports older
    than it carry only ``K`` and ``Q``)."""
    return str(inv.get("scope") or f"at most {inv['K']} active and {inv['Q']} queued requests")

def scope_line(data: dict[str, Any]) -> str:
    """What the memory invariant's verdict covers and, where bounded, why (from report.json's
    ``proofs.invariant``): ``""`` without a proofs section."""
    inv = (data.get("proofs") or {}).get("invariant")
    if not inv:
        return ""
    if inv.get("unbounded"):
        return f"scope: {_scope(inv)} (the unbounded theorem: the rule is made of kvstab.contract's folds)"
    why = next((n for n in inv.get("notes", []) if n.startswith("not proved for every number of requests")), "")
    why = why.removesuffix("; the verdict below is bounded by K and Q")
    return (f"scope: {_scope(inv)}, the bounds K = {inv['K']} and Q = {inv['Q']} of profile {data['profile']}"
            + (f", because it is {why}" if why else ""))


def _where(m: dict[str, Any]) -> str:
    """At which ``M`` the margin holds (the audit's ``where``; reports older than it carry only ``M``)."""
    return str(m.get("where") or f"at M = {m['M']}")


def _f(x: Any, digits: int = 5) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}g}"


def summary_rows(data: dict[str, Any]) -> list[list[str]]:
    """The side-by-side table: one row per scheduler."""
    th = data["theory"]
    rows = []
    for name, st in data["stability"].items():
        lo, hi = st["critical_rate_ci_per_s"]
        sat = st["saturated_throughput_per_s"]
        below = nearest_below(st)
        cert = th["certified_rate_per_s"] if name == data["scheduler"] else th["baselines"].get(name, {}).get("certified_rate_per_s")
        rows.append([
            name,
            f"{_f(st['critical_rate_per_s'])} [{_f(lo)}, {_f(hi)}]",
            f"{st['critical_over_mu']:.4f}",
            f"{_f(sat[0])} [{_f(sat[1])}, {_f(sat[2])}]",
            f"{_f(below['rate_per_s'])} ({below['load_over_mu']:.3f}·μ)",
            f"{below['memory_utilisation']:.3f}",
            f"{below['waste_fraction']:.4f}",
            "/".join(_f(v, 3) for v in below["ttft_s_p50_p90_p99"]),
            "/".join(_f(v, 3) for v in below["e2e_s_p50_p90_p99"]),
            _f(cert),
        ])
    return rows


def nearest_below(st: dict[str, Any]) -> dict[str, Any]:
    """The measured load nearest below λ* (of every rate the search and the curves ran), where the
    report's memory, waste and latency are read; the overload run if none was measured below."""
    return max((e for e in [*st["search"], *st["grid"]] if e["rate_per_s"] < st["critical_rate_per_s"]),
               key=lambda e: e["rate_per_s"], default=st["overload"])


HEADER = ["scheduler", "λ* (req/s) [95 % interval]", "λ*/μ", "saturated throughput (req/s)",
          "measured load nearest below λ* (req/s)", "memory used/M below λ*", "waste below λ*", "TTFT p50/p90/p99 (s)", "end-to-end p50/p90/p99 (s)",
          "certified rate (req/s)"]


def replays(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every failure the report names and the one line that shows it again: (what, command)."""
    out = [(c["name"], c["replay_command"]) for c in data["checks"] if c.get("replay_command")]
    for f in (data.get("properties") or {}).get("findings", []):
        if f["audit"] or f["replay"]:
            out.append((f"property {short_name(f['test'])}", f["audit"] or f["replay"]))
    return out


def _replay_lines(data: dict[str, Any]) -> list[str]:
    """report.md's list of the failures' replay lines (nothing when there is none)."""
    got = replays(data)
    if not got:
        return []
    return ["### Replay each failure", "", *[f"- {what}: `{cmd}`" for what, cmd in got], ""]


def _caching(data: dict[str, Any]) -> list[str]:
    """The prefix-caching lines every report carries where caching matters (the ``prefix caching``
    check is there: caching on, or λ* searched both ways): on or off, μ the no-sharing formula with
    measured/μ, and λ* with and without caching side by side."""
    from kvstab.audit.audit import caching_lines

    if not any(c["name"] == "prefix caching" for c in data["checks"]):
        return []
    return caching_lines(data)


def _caching_md(data: dict[str, Any]) -> list[str]:
    """report.md's prefix-caching section (nothing where caching does not matter)."""
    got = _caching(data)
    if not got:
        return []
    return ["## Prefix caching", "", *[f"- {line}" for line in got], ""]


def markdown(data: dict[str, Any]) -> str:
    """``report.md``."""
    th = data["theory"]
    sv = data["server"]
    lines = [
        f"# kvstab audit: {data['scheduler']} — {data['verdict']}",
        "",
        f"Server: M = {sv['M']}, ŝ = {sv['chunk']}, B = {sv['block']}, b̄ = {sv['bbar_s']} s"
        + (f", token budget {sv['token_budget']}" if sv["token_budget"] else "")
        + (f", max_num_seqs {sv['max_num_seqs']}" if sv["max_num_seqs"] else "")
        + f", queue window {data.get('window', 8)}"
        + f". Workload: {th['workload']} (Poisson arrivals). Profile: {data['profile']}, seed {data['seed']}.",
        "",
        "## Verdict",
        "",
        "| check | status | detail |",
        "|---|---|---|",
        *[f"| {c['name']} | {c['status']} | {c['detail']} |" for c in data["checks"]],
        "",
        f"**{data['verdict']}** (exit status {data['exit_status']}).",
        "",
        *_replay_lines(data),
        *_caching_md(data),
        "## Theory",
        "",
        f"- E[g] = {_f(th['E_g'], 7)} token-slots; μ = {_f(th['mu_per_s'])} req/s ({_f(th['mu_per_slot'])} per slot)",
        f"- δ = {th['delta']:.5f}; μ(1−δ) = {_f(th['mu_1_minus_delta_per_s'])} req/s",
        f"- certified for {data['scheduler']}: "
        + (th["certified_basis"] if th["certified_rate_per_s"] is None
           else f"{_f(th['certified_rate_per_s'])} req/s — {th['certified_basis']}"),
        "",
    ]
    if data["proofs"]:
        inv = data["proofs"]["invariant"]
        lines += ["## Proofs", "", f"- memory invariant (any M, {_scope(inv)}): **{inv['verdict']}**"
                  + (f", strengthened by {', '.join(inv['strengthening'])}" if inv["strengthening"] else "")]
        lines.append(f"  - {scope_line(data)}")
        if inv.get("replay_command"):
            lines.append(f"  - replay: `{inv['replay_command']}`")
        m = data["proofs"]["margin"]
        if m:
            lines.append(f"- margin Δ {_where(m)}, ŝ = {m['chunk']}, s ≤ {m['max_s']}, o ≤ {m['max_o']}: "
                         f"{m['delta']} tokens ({m['verdict']}); "
                         + ("no margin declared" if m["declared"] is None else f"declared {m['declared']}"))
        for c in (data["proofs"].get("claims") or {}).get("claims", []):
            lines.append(f"- claim {c['claim']} ({c['scope']}): **{c['verdict']}**")
            if c["verdict"] == "Refuted" and c.get("witness"):
                lines += [f"  - {ln.strip()}" for ln in c["witness"].splitlines() if not ln.strip().startswith("replay")]
            lines += [f"  - replay: `{cmd}`" for cmd in c.get("replay_commands", [])]
        lines.append("")
    if data["properties"]:
        lines += ["## Properties", "", f"- {data['properties']['summary']}", ""]
        for f in data["properties"].get("findings", []):
            lines.append(f"- **{short_name(f['test'])}**: {f['message']}")
            if f["workload"]:
                lines.append(f"  - workload: {f['workload']}")
            for key in ("audit", "replay"):
                if f[key]:
                    lines.append(f"  - {'check' if key == 'audit' else 'replay'}: `{f[key]}`")
        lines.append("")
    if data["stability"]:
        lines += ["## Stability region", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(r) + " |" for r in summary_rows(data)]
        methods = sorted({st["method"] for st in data["stability"].values()})
        how = {
            "saturated": "the saturated throughput under overload, confirmed by a run just above it whose queue "
                         "grows and one below it whose queue does not",
            "bisection": "bisection on the sign of the growth slope minus a threshold h",
        }
        lines += ["", f"μ = {_f(th['mu_per_s'])} req/s, μ(1−δ) = {_f(th['mu_1_minus_delta_per_s'])} req/s. "
                  "λ* is the rate where the number in system starts to grow, found by "
                  + "; or ".join(f"{how.get(m, m)} ({m})" for m in methods)
                  + " — batch-means intervals over seeds; see docs/audit.md. "
                  "Memory, waste and latency are at the measured load nearest below λ* (its own column).", ""]
        for name, st in data["stability"].items():
            for n in st["notes"]:
                lines.append(f"- note ({name}): {n}")
        lines += ["", "### Every measured load", "",
                  "| scheduler | λ (req/s) | λ/μ | seeds | growth per slot [95 %] | throughput (req/s) [95 %] | "
                  "memory/M | waste | TTFT p50/p90/p99 (slots) | end-to-end p50/p90/p99 (slots) | run for | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, st in data["stability"].items():
            evs = sorted([*st["search"], *st["grid"], st["overload"]], key=lambda e: e["rate_per_s"])
            for e in evs:
                g, t = e["growth_per_slot"], e["throughput_per_s"]
                lines.append(
                    f"| {name} | {_f(e['rate_per_s'])} | {e['load_over_mu']:.3f} | {e['seeds']} | "
                    f"{g[0]:+.3g} [{g[1]:+.3g}, {g[2]:+.3g}] | {_f(t[0])} [{_f(t[1])}, {_f(t[2])}] | "
                    f"{e['memory_utilisation']:.3f} | {e['waste_fraction']:.4f} | "
                    f"{'/'.join(_f(v, 3) for v in e['ttft_slots_p50_p90_p99'])} | "
                    f"{'/'.join(_f(v, 3) for v in e['e2e_slots_p50_p90_p99'])} | {e.get('purpose', '')} | {e['verdict']} (by its {e['decided_by']}) |")
        lines += ["", "![throughput vs λ](throughput.png)", "", "![queue below and above λ*](queue.png)", "",
                  "![memory utilisation](memory.png)", "", "![preemption waste](waste.png)", ""]
    return "\n".join(lines)


def _html(data: dict[str, Any], plots: dict[str, Path]) -> str:
    esc = html.escape
    th = data["theory"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>kvstab audit: {esc(data['scheduler'])}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px;color:#111;background:#fff}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #999;padding:4px 8px;font-size:14px}"
        ".pass{background:#c8f0c8}.fail{background:#f5b8b8}.unknown,.skipped{background:#f5e6a8}"
        "img{max-width:100%;border:1px solid #ccc;margin:0.5em 0}</style></head><body>",
        f"<h1>kvstab audit: {esc(data['scheduler'])} — <span class='{esc(data['verdict'].lower())}'>"
        f"{esc(data['verdict'])}</span></h1>",
        f"<p>M = {data['server']['M']}, ŝ = {data['server']['chunk']}, B = {data['server']['block']}, "
        f"b̄ = {data['server']['bbar_s']} s; workload {esc(th['workload'])}; profile {esc(str(data['profile']))}.</p>",
        "<h2>Verdict</h2><table><tr><th>check</th><th>status</th><th>detail</th></tr>",
        *[f"<tr class='{esc(c['status'])}'><td>{esc(c['name'])}</td><td>{esc(c['status'])}</td>"
          f"<td>{esc(c['detail'])}</td></tr>" for c in data["checks"]],
        "</table>",
        *(["<h3>Replay each failure</h3><ul>"]
          + [f"<li>{esc(what)}: <code>{esc(cmd)}</code></li>" for what, cmd in replays(data)] + ["</ul>"]
          if replays(data) else []),
        *(["<h2>Prefix caching</h2><ul>"] + [f"<li>{esc(line)}</li>" for line in _caching(data)] + ["</ul>"]
          if _caching(data) else []),
        f"<h2>Theory</h2><p>E[g] = {_f(th['E_g'], 7)}; μ = {_f(th['mu_per_s'])} req/s; δ = {th['delta']:.5f}; "
        f"μ(1−δ) = {_f(th['mu_1_minus_delta_per_s'])} req/s; certified: {esc(th['certified_basis'])}</p>",
    ]
    if data["proofs"]:
        inv = data["proofs"]["invariant"]
        parts.append(f"<h2>Proofs</h2><p>Memory invariant (any M, {esc(_scope(inv))}): "
                     f"<b>{esc(inv['verdict'])}</b>."
                     + f" {esc(scope_line(data))}."
                     + (f" Replay: <code>{esc(inv['replay_command'])}</code>" if inv.get("replay_command") else ""))
        m = data["proofs"]["margin"]
        if m:
            parts.append(f" Margin Δ {esc(_where(m))}, ŝ = {m['chunk']}, s ≤ {m['max_s']}, o ≤ {m['max_o']}: "
                         f"{esc(str(m['delta']))} tokens ({esc(m['verdict'])}); "
                         + ("no margin declared." if m["declared"] is None else f"declared {esc(str(m['declared']))}."))
        parts.append("</p>")
        claims = (data["proofs"].get("claims") or {}).get("claims", [])
        if claims:
            parts.append("<ul>" + "".join(f"<li>claim {esc(c['claim'])} ({esc(c['scope'])}): <b>{esc(c['verdict'])}</b>"
                                          + "".join(f"<br><code>{esc(cmd)}</code>" for cmd in c.get("replay_commands", []))
                                          + "</li>" for c in claims) + "</ul>")
    if data["properties"]:
        parts.append(f"<h2>Properties</h2><p>{esc(data['properties']['summary'])}</p>")
        items = []
        for f in data["properties"].get("findings", []):
            extra = "".join(f"<br><code>{esc(f[k])}</code>" for k in ("audit", "replay") if f[k])
            wl = f"<br>workload: {esc(f['workload'])}" if f["workload"] else ""
            items.append(f"<li><b>{esc(short_name(f['test']))}</b>: {esc(f['message'])}{wl}{extra}</li>")
        if items:
            parts.append("<ul>" + "".join(items) + "</ul>")
    if data["stability"]:
        parts.append("<h2>Stability region</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in HEADER) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in summary_rows(data)]
        parts.append("</table>")
    for name, path in plots.items():
        b64 = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<h3>{esc(name)}</h3><img alt='{esc(name)}' src='data:image/png;base64,{b64}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _tex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("μ", r"$\mu$"), ("λ", r"$\lambda$"), ("δ", r"$\delta$"), ("Δ", r"$\Delta$"), ("ŝ", r"$\hat{s}$"),
                 ("b̄", r"$\bar{b}$"), ("−", "-"), ("≤", r"$\le$"), ("≥", r"$\ge$"), ("·", r"$\cdot$"),
                 ("±", r"$\pm$"), ("→", r"$\to$"), ("…", "...")):
        s = s.replace(a, b)
    return s


def tex(data: dict[str, Any]) -> str:
    """``report.tex``: a ``\\section`` with the comparison table (needs ``booktabs``)."""
    th = data["theory"]
    sv = data["server"]
    out = [
        f"\\section{{Stability audit of \\texttt{{{_tex_escape(data['scheduler'])}}}}}",
        f"On a server with $M = {sv['M']}$ tokens, $\\hat{{s}} = {sv['chunk']}$, $\\bar{{b}} = {sv['bbar_s']}$\\,s "
        f"and workload {_tex_escape(th['workload'])}, the model gives $\\mathbb{{E}}[g] = {th['E_g']:.6g}$, "
        f"$\\mu = {th['mu_per_s']:.5g}$ requests/s, $\\delta = {th['delta']:.4f}$"
        + (f" and $\\mu(1-\\delta) = {th['mu_1_minus_delta_per_s']:.5g}$" if th["mu_1_minus_delta_per_s"] else "")
        + ". Table~\\ref{tab:kvstab-audit} gives the measured critical rate $\\lambda^*$ "
        "(95\\,\\% interval) of each scheduler.",
        "\\begin{table}[t]\\centering\\small",
        "\\begin{tabular}{lrrrr}\\toprule",
        "scheduler & $\\lambda^*$ (req/s) & interval & $\\lambda^*/\\mu$ & waste below $\\lambda^*$ \\\\\\midrule",
    ]
    for name, st in data["stability"].items():
        lo, hi = st["critical_rate_ci_per_s"]
        below = nearest_below(st)
        out.append(f"\\texttt{{{_tex_escape(name)}}} & {st['critical_rate_per_s']:.4g} & [{lo:.4g}, {hi:.4g}] & "
                   f"{st['critical_over_mu']:.3f} & {below['waste_fraction']:.4f} \\\\")
    out += [
        "\\bottomrule\\end{tabular}",
        f"\\caption{{Critical arrival rates measured by \\texttt{{kvstab audit}} (profile {data['profile']}). "
        f"Verdict: {data['verdict']}.}}\\label{{tab:kvstab-audit}}",
        "\\end{table}",
        *[_tex_escape(line) + "\\par" for line in _caching(data)],
        "",
    ]
    return "\n".join(out)


def write_report(res: AuditResult, out: Path) -> dict[str, Path]:
    """Write every report file into ``out`` (which must exist); name → path."""
    data = res.to_json()
    files: dict[str, Path] = {}
    plots: dict[str, Path] = {}
    if res.regions:
        from kvstab.audit.plots import write_plots

        plots = write_plots(list(res.regions.values()), data["theory"]["mu_per_s"],
                            data["theory"]["mu_1_minus_delta_per_s"], out)
        files.update(plots)
    (out / "report.json").write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    (out / "report.md").write_text(markdown(data))
    (out / "report.html").write_text(_html(data, plots))
    (out / "report.tex").write_text(tex(data))
    for n in ("json", "md", "html", "tex"):
        files[f"report.{n}"] = out / f"report.{n}"
    return files
