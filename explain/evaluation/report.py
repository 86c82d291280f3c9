"""Human-readable views of a results file: a markdown table and a PNG of the curves."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping
from typing import Any

from explain.evaluation.protocol import Column
from explain.export import atomic_write
from explain.viz.literal import literal_text

__all__ = ["markdown_table", "plot_results"]


def _decimals(value: float) -> int:
    return 2 if abs(value) >= 1.5 else 3


def _cell(value: Any, error: float | None = None, marked: bool = False) -> str:
    """A number to 2 decimals (3 below 1.5), its standard error to as many, bold when
    `marked`; "n/a" for a number no example defines (NaN, or null in a results file)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if not isinstance(value, float):
        return str(value)
    places = _decimals(value)
    text = f"{value:.{places}f}" + ("" if error is None else f" ± {error:.{places}f}")
    return f"**{text}**" if marked else text


def markdown_table(results: Mapping[str, Any], columns: Mapping[str, Column]) -> str:
    """One row per method of a results dict, one column per summary key in `columns`.

    Ranking numbers show their bootstrap standard error; the best value of each and the
    values within noise of it are bold (`results["ties"]`). The reading notes (the
    protocol's scale, what ± and bold mean) and the skipped methods with their reasons
    follow the table."""
    headers = ["method", *(column.title for column in columns.values())]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    ties = results.get("ties", {})
    for method, summary in results["results"].items():
        errors = summary.get("standard_errors", {})
        cells = [f"`{method}`"]
        for key in columns:
            marked = len(results["results"]) > 1 and method in ties.get(key, ())
            cells.append(_cell(summary.get(key, ""), errors.get(key), marked))
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    if results.get("scale"):
        notes.append(results["scale"])
    if ties:
        rounds = results["bootstrap"]["rounds"]
        level = results["bootstrap"]["level"]
        notes.append(
            f"± is the bootstrap standard error ({rounds} resamples of the examples). **Bold**: "
            f"the best value and every value within noise of it (the central {level:.0%} of "
            "the paired bootstrap differences from the best contains 0)."
        )
    if notes:
        lines.append("\n" + " ".join(notes))
    for method, reason in results.get("skipped", {}).items():
        lines.append(f"\n`{method}` skipped: {reason}")
    return "\n".join(lines) + "\n"


_BESIDE = {"fontsize": "small", "loc": "upper left", "bbox_to_anchor": (1.02, 1.0)}
"""Legend placement: outside the axes, to their right."""

_OVERLAP_STYLES = ("--", ":", "-.")
"""Line styles of the second, third, ... curve drawn exactly on an earlier one."""


def _plot_lines(axis, lines: list[tuple[str, list[float], list[float]]]) -> None:
    """Draw `(label, x, y)` curves so that none hides another: a curve equal to an earlier
    one (to 1e-9) is drawn dashed with smaller markers on top of it, and its legend entry
    says which curve it coincides with."""
    drawn: list[tuple[str, list[float], list[float]]] = []
    repeats = 0
    for label, x, y in lines:
        same = next(
            (
                first
                for first, x0, y0 in drawn
                if len(x0) == len(x)
                and all(abs(a - b) <= 1e-9 for a, b in zip(x0 + y0, x + y, strict=True))
            ),
            None,
        )
        if same is None:
            axis.plot(x, y, marker="o", label=label)
            drawn.append((label, x, y))
            continue
        style = _OVERLAP_STYLES[repeats % len(_OVERLAP_STYLES)]
        repeats += 1
        name = same.split(" (")[0]  # the method, without its AUC
        axis.plot(
            x, y, marker="x", markersize=5, linestyle=style, label=f"{label} = {name}", zorder=3
        )


@literal_text
def plot_results(results: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Save the protocol's curves as a PNG (atomically): accuracy (perturbation, ROAD),
    the class probabilities (class-specific) or the answer's log-probability (language-
    and vision-language-evidence, with ERASER's curves) against the removed fraction,
    token F1 against k (rationale), each group's probability drop (SaCo), or bars
    (segmentation).

    Legends sit beside their axes, never on the data; the constrained layout makes room.
    Methods with identical curves are all visible: the later ones dashed on top, their
    legend entries saying "= METHOD"."""
    from matplotlib.figure import Figure

    protocol = results["protocol"]
    per_method = results["results"]
    if protocol == "perturbation":
        figure = Figure(figsize=(13, 8), layout="constrained")
        axes = figure.subplots(2, 2, sharex=True, sharey=True).flatten()
        panels = ("positive_predicted", "negative_predicted", "positive_target", "negative_target")
        for axis, curve in zip(axes, panels, strict=True):
            lines = [
                (
                    f"{method} ({summary[_auc_key(curve)]:.1f})",
                    summary["curves"]["fractions"],
                    summary["curves"][curve],
                )
                for method, summary in per_method.items()
            ]
            _plot_lines(axis, lines)
            axis.set_title(curve.replace("_", " ") + " class")
            axis.set_xlabel("fraction of pixels removed")
            axis.set_ylabel("top-1 accuracy")
            axis.legend(**_BESIDE, title="method (AUC)")
    elif protocol == "class-specific":
        figure = Figure(figsize=(16, 4.5), layout="constrained")
        axes = figure.subplots(1, 3, sharey=True)
        panels = (
            ("positive", "target class, most relevant first"),
            ("negative", "target class, least relevant first"),
            ("other_positive", "other class, target's most relevant first"),
        )
        for axis, (curve, title) in zip(axes, panels, strict=True):
            lines = [
                (method, summary["curves"]["fractions"], summary["curves"][curve])
                for method, summary in per_method.items()
            ]
            _plot_lines(axis, lines)
            axis.set_title(title)
            axis.set_xlabel("fraction of pixels removed")
            axis.set_ylabel("mean class probability")
        axes[-1].legend(**_BESIDE)  # the AUCs of all three panels are in the table
    elif protocol == "rationale":
        figure = Figure(figsize=(8, 4), layout="constrained")
        axis = figure.subplots()
        lines = [
            (method, [float(k) for k in summary["token_f1"]], list(summary["token_f1"].values()))
            for method, summary in per_method.items()
        ]
        _plot_lines(axis, lines)
        axis.set_xlabel("k (top-k words)")
        axis.set_ylabel("token F1")
        axis.legend(**_BESIDE)
    elif protocol in _CURVE_PANELS:
        panels = _CURVE_PANELS[protocol]
        rows = (len(panels) + 1) // 2
        figure = Figure(figsize=(13, 4.5 * rows), layout="constrained")
        axes = figure.subplots(rows, 2, squeeze=False).flatten()
        for axis, (block, curve, title, xlabel, ylabel) in zip(axes, panels, strict=True):
            lines = [
                (method, summary[block]["fractions"], summary[block][curve])
                for method, summary in per_method.items()
            ]
            _plot_lines(axis, lines)
            axis.set_title(title)
            axis.set_xlabel(xlabel)
            axis.set_ylabel(ylabel)
        axes[1].legend(**_BESIDE)  # the areas are in the table
    elif protocol == "saco":
        figure = Figure(figsize=(8, 4), layout="constrained")
        axis = figure.subplots()
        lines = []
        for method, summary in per_method.items():
            groups = [float(k + 1) for k in range(len(summary["drops"]))]
            lines.append((f"{method} ({summary['saco']:.2f})", groups, summary["drops"]))
        _plot_lines(axis, lines)
        axis.set_xlabel("group of pixels, most relevant first")
        axis.set_ylabel("mean drop of the class's probability")
        axis.legend(**_BESIDE, title="method (SaCo)")
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


_REMOVED = "fraction removed"
_CURVE_PANELS: dict[str, tuple[tuple[str, str, str, str, str], ...]] = {
    "language-evidence": (
        ("curves", "positive", "most relevant tokens first", _REMOVED, "answer log-probability"),
        ("curves", "negative", "least relevant tokens first", _REMOVED, "answer log-probability"),
        ("eraser", "comprehensiveness", "comprehensiveness", "share removed", "drop of p(answer)"),
        ("eraser", "sufficiency", "sufficiency", "share kept", "drop of p(answer)"),
    ),
    "vision-language-evidence": (
        ("curves", "positive", "most relevant patches first", _REMOVED, "answer log-probability"),
        ("curves", "negative", "least relevant patches first", _REMOVED, "answer log-probability"),
    ),
    "road": (
        ("curves", "morf", "most relevant first (MoRF), imputed", _REMOVED, "top-1 accuracy"),
        ("curves", "lerf", "least relevant first (LeRF), imputed", _REMOVED, "top-1 accuracy"),
    ),
}
"""The curve panels of the protocols that draw curves: (summary block, curve, title,
x label, y label) per panel, the x values being the block's "fractions"."""


def _auc_key(curve: str) -> str:
    sign, whose = curve.split("_")
    return f"{sign}_auc_{whose}"
