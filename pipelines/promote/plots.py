"""The replicas' memory over a promotion, as a picture for its MLflow run (``memory.png``).

Drawn from what the memory headroom guard reported (pipelines/guards/headroom.py ``to_dict``):
its ``samples`` (each device's used and total bytes at each reading) and ``events`` (each load,
refusal, failed load and leak), on its clock.  One line per replica and device, a marker at each
reading, the device's total as a dashed line of the same colour, and a vertical line at each
event, labelled.  matplotlib is imported only here, and only when there is something to draw; a
bare ``Figure`` on the Agg canvas leaves pyplot's global state (a notebook's backend) alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MIB = 2**20
EVENT_STYLE = {  # the first word of an event -> (colour, line style)
    "load": ("grey", ":"),
    "refused": ("red", "-"),
    "failed": ("black", "-."),
    "leak": ("darkred", "--"),
}
# the lines' colours: matplotlib's tab10 without its red and grey, which the events use
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]


def series(samples: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The samples by (replica, device), each in the order read."""
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for sample in samples:
        found.setdefault((sample["replica"], sample["device"]), []).append(sample)
    return found


def memory_plot(headroom: Mapping[str, Any], title: str, path: Path) -> Path | None:
    """Draw ``headroom``'s samples into the PNG ``path`` (None: no samples, nothing drawn): GPUs
    and the host on axes of their own, their scales being far apart."""
    samples = headroom.get("samples") or []
    if not samples:
        return None
    # lazy: matplotlib costs ~0.3 s to import, paid only when there is something to draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib ~0.4 s, only to draw
    from matplotlib.figure import Figure  # lazy: matplotlib ~0.4 s, only to draw
    from matplotlib.ticker import StrMethodFormatter  # lazy: matplotlib ~0.4 s, only to draw

    kinds = {"GPU": [s for s in samples if s["device"] != "host"]}
    kinds["host"] = [s for s in samples if s["device"] == "host"]
    drawn = {kind: found for kind, found in kinds.items() if found}
    figure = Figure(figsize=(11, 2.5 + 3 * len(drawn)), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    for row, (kind, found) in enumerate(drawn.items(), start=1):
        axes = figure.add_subplot(len(drawn), 1, row)
        axes.set_prop_cycle(color=COLOURS)
        axes.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        events = headroom.get("events") or []
        if len(series(found)) > CROWD:  # a fleet: thin unlabelled lines, and only what went wrong
            draw_crowd(axes, found)
            events = [e for e in events if not e["what"].startswith("load")]
        else:
            draw_series(axes, found)
        draw_events(axes, events)
        axes.set(ylabel=f"{kind} memory used (MiB)")
        axes.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
        axes.grid(alpha=0.3)
    axes.set(xlabel="seconds into the promotion")
    figure.savefig(path, format="png", dpi=100)
    return path


CROWD = 16  # more (replica, device) lines than this: drawn as one crowd (a legend of 200 would not fit)


def draw_crowd(axes: Any, samples: Sequence[Mapping[str, Any]]) -> None:
    """Every replica's line thin and in one colour, one legend entry for them all, and their total
    where they share one."""
    lines = series(samples)
    for points in lines.values():
        axes.plot(
            [p["seconds"] for p in points],
            [p["used_bytes"] / MIB for p in points],
            color=COLOURS[0],
            lw=0.5,
            alpha=0.4,
        )
    axes.plot([], [], color=COLOURS[0], lw=0.5, label=f"{len(lines)} replicas/devices")
    totals = {p["total_bytes"] for points in lines.values() for p in points[-1:] if p.get("total_bytes")}
    if len(totals) == 1:
        axes.axhline(totals.pop() / MIB, color="grey", ls="--", lw=0.8, label="total (each)")


def draw_series(axes: Any, samples: Sequence[Mapping[str, Any]]) -> None:
    """One line per replica and device, a marker at each reading; each total dashed, where known
    (in the line's colour; grey, once, for a total several devices share)."""
    totals: dict[int, list[tuple[str, str]]] = {}  # bytes -> (name, colour) of the devices with it
    for (replica, device), points in series(samples).items():
        name = replica if device == "host" else f"{replica} {device[:12]}"
        seconds = [p["seconds"] for p in points]
        (line,) = axes.plot(seconds, [p["used_bytes"] / MIB for p in points], marker="o", ms=3, label=name)
        if points[-1].get("total_bytes"):
            totals.setdefault(points[-1]["total_bytes"], []).append((name, line.get_color()))
    for total, devices in totals.items():
        colour, name = devices[0][1], devices[0][0]
        if len(devices) > 1:
            colour, name = "grey", f"{len(devices)} devices"
        axes.axhline(total / MIB, color=colour, ls="--", lw=0.8, label=f"total of {name}")


def draw_events(axes: Any, events: Sequence[Mapping[str, Any]]) -> None:
    """A vertical line at each event, its colour by kind, labelled with the replica and what."""
    for event in events:
        colour, style = EVENT_STYLE.get(event["what"].split()[0], ("grey", ":"))
        axes.axvline(event["seconds"], color=colour, ls=style, lw=1)
        axes.annotate(
            f"{event['replica']}: {event['what']}",
            (event["seconds"], 0.99),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            color=colour,
            ha="right",
            va="top",
        )


def shadow_plot(shadow: Mapping[str, Any], title: str, path: Path) -> Path | None:
    """The shadow replay of one model (pipelines/checks/replay.py ``to_dict``) as the PNG
    ``path``: per output, the serving version's and the candidate's distributions (top-1 classes,
    or values), and each request's latency on both, candidate against serving (None: nothing
    replayed, nothing drawn)."""
    outputs = [o for o in shadow.get("outputs") or [] if o.get("histogram")]
    pairs = shadow.get("pairs_ms") or []
    if not outputs and not pairs:
        return None
    # lazy: matplotlib costs ~0.3 s to import, paid only when there is something to draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib ~0.4 s, only to draw
    from matplotlib.figure import Figure  # lazy: matplotlib ~0.4 s, only to draw

    panels = len(outputs) + (1 if pairs else 0)
    figure = Figure(figsize=(5 * panels, 4), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    for index, output in enumerate(outputs, start=1):
        axes = figure.add_subplot(1, panels, index)
        histogram = output["histogram"]
        if "classes" in histogram:
            classes = histogram["classes"]
            axes.bar(
                [c - 0.2 for c in classes], histogram["serving"], 0.4, label=f"serving v{shadow['serving']}"
            )
            axes.bar(
                [c + 0.2 for c in classes],
                histogram["candidate"],
                0.4,
                label=f"candidate v{shadow['candidate']}",
            )
            axes.set(xlabel=f"{output['name']}: top-1 class", ylabel="rows")
        else:
            edges = histogram["edges"]
            axes.stairs(histogram["serving"], edges, label=f"serving v{shadow['serving']}", lw=2)
            axes.stairs(
                histogram["candidate"], edges, label=f"candidate v{shadow['candidate']}", ls="--", lw=2
            )
            axes.set(xlabel=f"{output['name']}: value (KS {output.get('ks')})", ylabel="values")
        axes.set_title(
            f"{output['name']} ({output['kind']}): {output['diverged']} diverged, floor {output['floor']}"
        )
        axes.legend(fontsize="small")
    if pairs:
        axes = figure.add_subplot(1, panels, panels)
        candidate, serving = [p[0] for p in pairs], [p[1] for p in pairs]
        axes.scatter(serving, candidate, s=6, alpha=0.5)
        top = max(max(candidate), max(serving))
        axes.plot([0, top], [0, top], color="grey", ls=":", lw=1, label="equal")
        axes.set(xlabel="serving, ms", ylabel="candidate, ms", title="latency per replayed request")
        axes.legend(fontsize="small")
    figure.savefig(path, format="png", dpi=100)
    return path
