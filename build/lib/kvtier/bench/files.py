"""A bench's files: JSON (everything measured), CSV (one row per figure), PNG and a self-contained HTML page.

The plots are drawn with matplotlib (its Agg backend: no display needed); the HTML page carries them as
inline SVG next to the table of figures and the machine they were measured on, so it opens anywhere.
"""

from __future__ import annotations

import csv
import datetime
import html
import io
import json
import pathlib


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_json(path: pathlib.Path, data) -> pathlib.Path:
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_csv(path: pathlib.Path, rows: list) -> pathlib.Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def machine_line(machine: dict) -> str:
    return f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, {machine.get('memory_gib', '?')} GiB"


def figure(plots: list, title: str):
    """One matplotlib figure with a panel per plot. A plot: {title, xlabel, ylabel, series: {label: [(x, y50,
    y95)]}}, each series drawn as its median with the p95 above it as an error bar; or, with kind "bar",
    {categories: [...], series: {label: [value per category]}} as grouped bars."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(plots), figsize=(6.4 * len(plots), 4.6), squeeze=False)
    for ax, plot in zip(axes[0], plots, strict=True):
        if plot.get("kind") == "bar":
            _bars(ax, plot)
        for label, points in ({} if plot.get("kind") == "bar" else plot["series"]).items():
            points = sorted(p for p in points if p[1] is not None)
            if not points:
                continue
            xs, p50, p95 = zip(*points, strict=True)
            above = [max((b or a) - a, 0.0) for a, b in zip(p50, p95, strict=True)]
            ax.errorbar(xs, p50, yerr=[[0.0] * len(xs), above], marker="o", capsize=3, label=label)
        ax.set_title(plot["title"])
        ax.set_xlabel(plot["xlabel"])
        ax.set_ylabel(plot["ylabel"])
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def _bars(ax, plot: dict) -> None:
    width = 0.8 / max(len(plot["series"]), 1)
    for n, (label, values) in enumerate(plot["series"].items()):
        xs = [i + n * width for i in range(len(plot["categories"]))]
        ax.bar(xs, values, width, label=label)
    ax.set_xticks([i + width * (len(plot["series"]) - 1) / 2 for i in range(len(plot["categories"]))])
    ax.set_xticklabels(plot["categories"], fontsize="small", rotation=10)


def write_plots(directory: pathlib.Path, stem: str, plots: list, title: str, table: list, notes: list) -> list:
    """<stem>.png and <stem>.html (the plots, the figures' table and the notes); their paths."""
    plt = _pyplot()
    fig = figure(plots, title)
    png = directory / f"{stem}.png"
    fig.savefig(png, dpi=110)
    svg = io.StringIO()
    fig.savefig(svg, format="svg")
    plt.close(fig)
    page = directory / f"{stem}.html"
    page.write_text(_html(title, svg.getvalue(), table, notes))
    return [png, page]


def _html(title: str, svg: str, table: list, notes: list) -> str:
    svg = svg[svg.index("<svg") :]  # drop the XML prologue: the SVG sits inside the page
    columns = list(dict.fromkeys(k for row in table for k in row))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)

    def cell(value) -> str:
        return f"<td>{html.escape('' if value is None else str(value))}</td>"

    body = "".join("<tr>" + "".join(cell(row.get(c)) for c in columns) + "</tr>" for row in table)
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1400px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "th{background:#f3f3f3}svg{max-width:100%;height:auto}"
        f"</style></head><body><h1>{html.escape(title)}</h1><ul>{items}<li>made {made}</li></ul>"
        f"{svg}<h2>Figures</h2><table><tr>{head}</tr>{body}</table></body></html>\n"
    )
