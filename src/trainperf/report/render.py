"""Turn collected results into a self-contained HTML report (plots embedded) and a Markdown twin.

Every piece of text that comes from a file or a folder name is escaped: a workload, system or path
name cannot inject markup.
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from trainperf import __version__, plots
from trainperf.files import write_bytes_atomic, write_text_atomic
from trainperf.report.collect import GroupView, ReportData, RunView

SYSTEM_FIELDS = ("submitter", "division", "status", "number_of_nodes", "host_processor_model_name",
                 "host_processor_core_count", "host_processor_vcpu_count", "host_memory_capacity",
                 "accelerators_per_node", "accelerator_model_name", "accelerator_memory_capacity", "framework",
                 "operating_system")


@dataclass
class Figure:
    title: str
    png: bytes
    name: str


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


# ---------------------------------------------------------------------------------------------
# tables (as rows of plain strings, rendered to HTML or Markdown)
# ---------------------------------------------------------------------------------------------
def summary_rows(data: ReportData) -> tuple[list[str], list[list[str]]]:
    header = ["system", "benchmark", "scale", "runs", "converged", "score (min)", "spread (min)", "epochs to target",
              "samples/s", "note"]
    rows = []
    for g in data.groups:
        minutes = g.minutes
        epochs = [r.epochs_to_target for r in g.runs if r.epochs_to_target is not None and r.status == "success"]
        rates = [r.samples_per_s for r in g.runs if r.samples_per_s]
        score = _fmt(g.score) if g.score is not None else (f"{_fmt(g.headline)} (mean)" if g.headline else "-")
        score = score if g.valid else "invalid"
        rows.append([
            g.system, g.benchmark, g.scale, str(len(g.runs)), str(len(minutes)), score,
            f"{min(minutes):.3f} – {max(minutes):.3f}" if minutes else "-",
            _fmt(statistics.median(epochs), "g") if epochs else "-",
            _fmt(statistics.median(rates), ".1f") if rates else "-",
            g.score_note,
        ])
    return header, rows


def comparison_rows(data: ReportData) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per benchmark and scale run on several systems: each score and its speedup over the first.
    Mini and full results are never compared with each other."""
    out = []
    for bench, scale in sorted({(g.benchmark, g.scale) for g in data.groups}):
        groups = [g for g in data.groups if (g.benchmark, g.scale) == (bench, scale) and g.headline]
        if len(groups) < 2:
            continue
        base = groups[0].headline
        rows = [[g.system, _fmt(g.headline), f"{base / g.headline:.2f}x"] for g in groups]
        out.append((f"{bench} ({scale})", ["system", "time-to-train (min)", f"speedup vs {groups[0].system}"],
                    rows))
    return out


def scaling_rows(study: dict) -> tuple[list[str], list[list[str]]]:
    header = ["devices", "global batch", "s/epoch", "epochs", "time-to-train (s)", "speedup", "efficiency",
              "converged"]
    rows = [[str(r["devices"]), str(r["global_batch"]), _fmt(r["time_per_epoch_s"], ".2f"),
             _fmt(r["epochs_to_target"], ".1f"), _fmt(r["time_to_train_s"], ".2f"), _fmt(r["speedup"], ".2f"),
             _fmt(r["efficiency"], ".0%"), f"{r['converged']}/{r['runs']}"] for r in study["rows"]]
    return header, rows


def ablation_rows(study: dict) -> tuple[list[str], list[list[str]]]:
    header = ["configuration", "mode", "samples/s", "uplift", "MFU", "epochs to target"]
    rows = [[r["config"], r["mode"], _fmt(r["samples_per_s"], ".1f"), f"{r['uplift']:.2f}x",
             _fmt(r["mfu"], ".1%"), "-" if r.get("reached") is None else
             (str(r["epochs_to_target"]) if r["reached"] else "missed")] for r in study["rows"]]
    return header, rows


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------
def energy_rows(runs: Sequence[RunView]) -> tuple[list[str], list[list[str]]]:
    header = ["system", "benchmark", "run", "minutes", "energy kJ", "average W", "node source", "closed",
              "sampling meets the rules"]
    rows = []
    for r in runs:
        p = r.power or {}
        energy = p.get("energy_j")
        rows.append([r.system, r.benchmark, r.label, _fmt(r.minutes),
                     _fmt(energy / 1000 if energy is not None else None), _fmt(p.get("average_w"), ".1f"),
                     str(p.get("official_source") or "-"), "yes" if p.get("closed_accepted") else "no",
                     "yes" if p.get("meets_sampling_rules") else "no"])
    return header, rows


def convergence_figure(bench: str, groups: Sequence[GroupView], index: int) -> Figure | None:
    """Every run's evaluations against its target. A composite metric (Mask R-CNN's BBOX and SEGM)
    gets one line style per named value, each with its own target line."""
    runs = [(g, r) for g in groups for r in g.runs if r.evals]
    if not runs:
        return None
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["o-", "s--", "^:", "d-."]
    parts = sorted({k for _, r in runs for _, v in r.evals if isinstance(v, dict) for k in v})
    for gi, g in enumerate(groups):
        for ri, r in enumerate(rr for gg, rr in runs if gg is g):
            for pi, part in enumerate(parts or [None]):
                points = [(x, v[part] if part is not None else v) for x, v in r.evals
                          if (part is None and not isinstance(v, dict)) or (isinstance(v, dict) and part in v)]
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                label = None
                if ri == 0:
                    label = plots.short(g.system if part is None else f"{g.system} {part}")
                ax.plot(xs, ys, styles[pi % len(styles)], ms=3, lw=1.2, alpha=0.85, color=colors[gi % len(colors)],
                        label=label)
    targets: dict[str, float] = {}
    for g in groups:
        if isinstance(g.target, dict):
            targets.update({f"{k} target": float(v) for k, v in g.target.items()})
        elif isinstance(g.target, (int, float)):
            targets["target"] = float(g.target)
    for ti, (name, value) in enumerate(sorted(targets.items())):
        ax.axhline(value, color="crimson", ls=["--", ":", "-."][ti % 3], lw=1, label=plots.short(f"{name} {value:g}"))
    x_label = "samples" if all(r.x_label == "samples" for _, r in runs) else "epoch"
    ax.set(xlabel=x_label, ylabel=plots.short(groups[0].metric),
           title=plots.short(f"{bench}: convergence of every run", 100))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return Figure(f"{bench} convergence", plots.png(fig), f"convergence_{index}.png")


def ablation_figure(study: dict, index: int) -> Figure:
    title = study.get("title", "ablation")
    return Figure(f"ablation: {title}", plots.ablation_chart(study["rows"], title), f"ablation_{index}.png")


def scaling_figure(path: str, study: dict, index: int) -> Figure:
    title = study.get("title", path)
    return Figure(f"scaling: {title}", plots.scaling_chart(study["rows"], title), f"scaling_{index}.png")


# ---------------------------------------------------------------------------------------------
# documents
# ---------------------------------------------------------------------------------------------
def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#1d1d1f;padding:0 1em}h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}th,td{border:1px solid #ccc;padding:.3em .6em;
text-align:left}th{background:#f3f4f6}tr:nth-child(even) td{background:#fafafa}img{max-width:100%;
border:1px solid #eee;margin:.4em 0}pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
.muted{color:#666;font-size:.9em}"""


class _Doc:
    """An HTML document and its Markdown twin, written side by side; figures are embedded in the HTML
    and linked by file name from the Markdown (`<asset_prefix>_<figure>.png`, written beside it)."""

    def __init__(self, title: str, asset_prefix: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.prefix = asset_prefix
        self.figures: list[Figure] = []
        self.h = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                  f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
                  f"<p class='muted'>generated {html.escape(stamp)} by trainperf {html.escape(__version__)}</p>"]
        self.m = [f"# {_md_cell(title)}", "", f"generated {stamp} by trainperf {__version__}", ""]

    def section(self, title: str) -> None:
        self.h.append(f"<h2>{html.escape(title)}</h2>")
        self.m.extend([f"## {_md_cell(title)}", ""])

    def subsection(self, title: str) -> None:
        self.h.append(f"<h3>{html.escape(title)}</h3>")
        self.m.extend([f"### {_md_cell(title)}", ""])

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.h.append(_html_table(header, rows))
        self.m.extend([_md_table(header, rows), ""])

    def note(self, text: str) -> None:
        self.h.append(f"<p class='muted'>{html.escape(text)}</p>")
        self.m.extend([_md_cell(text), ""])

    def code(self, text: str, summary: str | None = None, lang: str = "") -> None:
        if summary:
            self.h.append(f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>")
        else:
            self.h.append(f"<pre>{html.escape(text)}</pre>")
        self.m.extend([f"```{lang}", text.replace("```", "'''"), "```", ""])

    def figure(self, fig: Figure | None) -> None:
        if fig is None:
            return
        fig.name = f"{self.prefix}_{fig.name}"
        self.figures.append(fig)
        encoded = base64.b64encode(fig.png).decode()
        self.h.append(f"<img alt='{html.escape(fig.title, quote=True)}' src='data:image/png;base64,{encoded}'>")
        self.m.extend([f"![{_md_cell(fig.title)}]({fig.name})", ""])

    def done(self) -> tuple[str, str, list[Figure]]:
        return "\n".join([*self.h, "</body></html>"]), "\n".join(self.m), self.figures


def build(data: ReportData, asset_prefix: str = "report") -> tuple[str, str, list[Figure]]:
    """(html, markdown, figures)."""
    doc = _Doc("trainperf report", asset_prefix)
    if data.groups:
        doc.section("Summary")
        doc.table(*summary_rows(data))
        doc.note("score: MLPerf olympic mean of run_start→run_stop (fastest and slowest dropped); with too few "
                 "runs, the mean of converged runs.")
        for bench, header, rows in comparison_rows(data):
            doc.section(f"{bench}: systems side by side")
            doc.table(header, rows)
        doc.section("Convergence")
        for i, bench in enumerate(sorted({g.benchmark for g in data.groups})):
            doc.figure(convergence_figure(bench, [g for g in data.groups if g.benchmark == bench], i))
    measured = [r for g in data.groups for r in g.runs if r.power is not None]
    if measured:
        doc.section("Energy to train")
        doc.table(*energy_rows(measured))
        doc.note("energy: the joules of run_start→run_stop as the official summarizer counts a node (each reading "
                 "times the interval before it), plus the interconnect's estimate; closed: whether the node's "
                 "source is one MLPerf's power rules accept (a PSU or PDU reading) rather than GPUs or CPUs alone.")
        for i, r in enumerate(measured):
            if r.power_png is not None:
                doc.figure(Figure(f"{r.system} / {r.benchmark} / {r.label}: power", r.power_png, f"power_{i}.png"))
    for i, (path, study) in enumerate(data.scaling):
        doc.section(f"Scaling study ({path})")
        doc.table(*scaling_rows(study))
        doc.figure(scaling_figure(path, study, i))
    for i, (path, study) in enumerate(data.ablations):
        doc.section(f"Speedup ablation ({path})")
        doc.table(*ablation_rows(study))
        doc.figure(ablation_figure(study, i))
    if data.systems:
        doc.section("Systems")
        names = list(data.systems)
        doc.table(["field", *names], [[f, *[str(data.systems[n].get(f, "")) for n in names]] for f in SYSTEM_FIELDS])
    runs = [r for g in data.groups for r in g.runs if r.command or r.recipe]
    if runs:
        doc.section("Commands and recipes")
        for r in runs:
            seed = f" (seed {r.seed})" if r.seed is not None else ""
            doc.subsection(f"{r.system} / {r.benchmark} {r.scale or ''} / {r.label}{seed}")
            if r.command:
                doc.code(r.command)
            if r.recipe:
                doc.code(json.dumps(r.recipe, indent=1), summary="recipe", lang="json")
    return doc.done()


def write_documents(built: tuple[str, str, list[Figure]], out: Path, markdown: bool) -> list[Path]:
    """The HTML file, and with `markdown` its .md twin and the figures' PNGs beside it."""
    html_text, md_text, figures = built
    written = [out]
    write_text_atomic(out, html_text)
    if markdown:
        md_path = out.with_suffix(".md")
        for fig in figures:
            target = md_path.parent / fig.name
            write_bytes_atomic(target, fig.png)
            written.append(target)
        write_text_atomic(md_path, md_text)
        written.append(md_path)
    return written


def write(data: ReportData, out: Path, markdown: bool) -> list[Path]:
    return write_documents(build(data, out.stem), out, markdown)


def suite_document(suite: dict, groups: Sequence[GroupView], environment: dict, asset_prefix: str = "suite"
                   ) -> tuple[str, str, list[Figure]]:
    """The round's report: its table (one row per workload, a failure with its reason), one convergence
    figure per workload, and where it ran."""
    doc = _Doc(f"trainperf suite: {suite['scale']} scale, {suite['runs']} run(s) per workload", asset_prefix)
    doc.section("Round")
    header = ["workload", "MLPerf key", "ruleset", "metric", "target", "time-to-train", "converged",
              "epochs to target", "throughput (samples/s)", "wall (s)", "status"]
    rows = []
    for r in suite["rows"]:
        if r.score_minutes is None:
            ttt = "-"
        else:
            ttt = f"{r.score_minutes * 60:.1f} s ({r.score_kind})"
        status = r.status + (f": {r.reason}" if r.reason else "")
        rows.append([r.workload, r.benchmark, r.ruleset, r.metric, r.target, ttt, f"{r.converged}/{r.runs}",
                     "-" if r.epochs_to_target is None else f"{r.epochs_to_target:g}"
                     + (" samples" if r.epoch_unit == "samples" else ""),
                     _fmt(r.samples_per_s, ",.1f"), f"{r.wall_s:.0f}", status])
    doc.table(header, rows)
    doc.note(f"time-to-train: the MLPerf olympic mean of run_start→run_stop where there are enough runs, else the "
             f"mean of converged runs (one run: its time). Whole suite: {suite['wall_s'] / 60:.1f} min of wall time, "
             f"first seed {suite['seed']}.")
    doc.section("Convergence")
    for i, g in enumerate(groups):
        doc.figure(convergence_figure(g.benchmark, [g], i))
    doc.section("Environment")
    flat = {k: v for k, v in environment.items() if not isinstance(v, (dict, list))}
    flat.update({f"{k} version": v for k, v in (environment.get("versions") or {}).items()})
    flat["gpus"] = ", ".join(environment.get("gpus") or []) or "none"
    doc.table(["field", "value"], [[k, str(v)] for k, v in flat.items()])
    return doc.done()
