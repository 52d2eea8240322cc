"""The charts trainperf draws (headless matplotlib), each returned as PNG bytes so that a study can
save it beside its data and a report can embed the very same picture."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def short(text: Any, limit: int = 60) -> str:
    """A label from a file (a system, a configuration), cut to fit a chart: drawing a very long one
    takes matplotlib minutes (40 s for 200,000 characters here)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


def scaling_chart(rows: Sequence[dict[str, Any]], title: str, label: str = "measured") -> bytes:
    """Time-to-train and speedup against devices, with the ideal (linear) line."""
    plt = pyplot()
    devices = [r["devices"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(devices, [r["time_to_train_s"] or float("nan") for r in rows], "o-")
    left.set(xlabel="devices (processes)", ylabel=f"time-to-train (s, {'median' if label == 'measured' else label})",
             title="time-to-train")
    right.plot(devices, [r["speedup"] or float("nan") for r in rows], "o-", label=label)
    right.plot(devices, [d / devices[0] for d in devices], "--", color="grey", label="ideal (linear)")
    right.set(xlabel="devices (processes)", ylabel=f"speedup vs {devices[0]}", title="speedup")
    right.legend()
    for ax in (left, right):
        ax.set_xticks(devices)
        ax.grid(alpha=0.3)
    fig.suptitle(short(title, 100))
    return png(fig)


def ablation_chart(rows: Sequence[dict[str, Any]], title: str) -> bytes:
    """Throughput uplift of each configuration against the all-off baseline."""
    plt = pyplot()
    ordered = list(rows)[::-1]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(ordered) + 1.2))
    colors = {"baseline": "grey", "cumulative": "tab:blue", "alone": "tab:orange"}
    positions = list(range(len(ordered)))  # not the labels: two long ones may shorten alike
    ax.barh(positions, [r["uplift"] for r in ordered], color=[colors[r["mode"]] for r in ordered])
    ax.set_yticks(positions, labels=[short(r["config"]) for r in ordered])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set(xlabel="throughput vs baseline (x)", title=short(title, 100))
    for i, r in enumerate(ordered):
        ax.text(r["uplift"], i, f" {r['uplift']:.2f}x", va="center", fontsize=8)
    return png(fig)


def batch_chart(rows: Sequence[dict[str, Any]], title: str, unit: str = "epochs") -> bytes:
    """Epochs to converge (each run, and the median) and time-to-train (predicted and measured) against
    the global batch: the trade-off that decides the fastest batch."""
    plt = pyplot()
    batches = [r["batch"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        each = [e for e in r["epochs_each"] if e is not None]
        left.plot([r["batch"]] * len(each), each, "o", color="grey", alpha=0.4, ms=4)
    left.plot(batches, [r["epochs_to_converge"] or float("nan") for r in rows], "o-", label="median (grey: each run)")
    left.set(xlabel="global batch", ylabel=f"{unit} to converge", title=f"{unit} to converge")
    right.plot(batches, [r["predicted_s"] or float("nan") for r in rows], "o--", label="predicted (it x s/it)")
    right.plot(batches, [r["measured_s"] or float("nan") for r in rows], "s-", label="measured (median)")
    right.set(xlabel="global batch", ylabel="time-to-train (s)", title="time-to-train")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(short(title, 110), fontsize=10)
    return png(fig)
