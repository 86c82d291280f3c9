"""Human-readable views of a results file: a markdown table and a PNG of the curves."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

from explain.io import atomic_write

__all__ = ["markdown_table", "plot_results"]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) >= 1.5 else f"{value:.3f}"
    return str(value)


def markdown_table(results: Mapping[str, Any], columns: Mapping[str, str]) -> str:
    """One row per method of a results dict, one column per summary key in `columns`;
    skipped methods are listed under the table with the reason."""
    headers = ["method", *columns.values()]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for method, summary in results["results"].items():
        cells = [f"`{method}`", *(_cell(summary.get(key, "")) for key in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    for method, reason in results.get("skipped", {}).items():
        lines.append(f"\n`{method}` skipped: {reason}")
    return "\n".join(lines) + "\n"


_BESIDE = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.02, 1.0)}
"""Legend placement: outside the axes, to their right."""


def plot_results(results: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Save the protocol's curves as a PNG (atomically): accuracy against the removed
    fraction (perturbation), token F1 against k (rationale), or bars (segmentation).

    Legends sit beside their axes, never on the data; the constrained layout makes room."""
    from matplotlib.figure import Figure

    protocol = results["protocol"]
    per_method = results["results"]
    if protocol == "perturbation":
        figure = Figure(figsize=(13, 8), layout="constrained")
        axes = figure.subplots(2, 2, sharex=True, sharey=True).flatten()
        panels = ("positive_predicted", "negative_predicted", "positive_target", "negative_target")
        for axis, curve in zip(axes, panels, strict=True):
            for method, summary in per_method.items():
                x = summary["curves"]["fractions"]
                y = summary["curves"][curve]
                axis.plot(x, y, marker="o", label=f"{method} ({summary[_auc_key(curve)]:.1f})")
            axis.set_title(curve.replace("_", " ") + " class")
            axis.set_xlabel("fraction of pixels removed")
            axis.set_ylabel("top-1 accuracy")
            axis.legend(**_BESIDE, title="method (AUC)")
    elif protocol == "rationale":
        figure = Figure(figsize=(8, 4), layout="constrained")
        axis = figure.subplots()
        for method, summary in per_method.items():
            ks = [int(k) for k in summary["token_f1"]]
            axis.plot(ks, list(summary["token_f1"].values()), marker="o", label=method)
        axis.set_xlabel("k (top-k words)")
        axis.set_ylabel("token F1")
        axis.legend(**_BESIDE)
    else:
        figure = Figure(figsize=(10, 4), layout="constrained")
        axis = figure.subplots()
        keys = ("pixel_accuracy", "miou", "map")
        width = 0.8 / max(len(per_method), 1)
        for i, (method, summary) in enumerate(per_method.items()):
            positions = [k + i * width for k in range(len(keys))]
            axis.bar(positions, [summary[key] for key in keys], width, label=method)
        axis.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], list(keys))
        axis.set_ylim(0, 1)
        axis.legend(**_BESIDE)
    figure.suptitle(f"{protocol}: {results['model']} on {results['dataset']} (n = {results['n']})")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    with atomic_write(path) as handle:
        handle.write(buffer.getvalue())


def _auc_key(curve: str) -> str:
    sign, whose = curve.split("_")
    return f"{sign}_auc_{whose}"
