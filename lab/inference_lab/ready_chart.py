"""Ready time in the evidence ledger: each tier's starts (vanilla vLLM and the render as it ships,
cold, warm and from a warm-cache bundle) as a table and a stacked-bar chart of their phases, from
the `ready` steps of the proof records (inference_lab.proof_ready)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from inference_machine import PHASES
from inference_machine.checkpoint import RESTORE_PHASES
from inference_machine.writers import markdown_text

from .proof_plan import READY_STARTS, RESTORED

# the phases in the order a start passes them (a stacked bar's segments, left to right); a
# restored checkpoint's phases before the first answer both share (a start restored by its own
# unit's helper: from the unit's start to the restore, and the reference answer before the gate
# opens: proof_ready.restored_phases)
ORDER = (*(p for p in PHASES.values() if p != "first_answer"), "unit_start",
         *(p for p in RESTORE_PHASES if p != "first_answer"), "reference_answer",
         "first_answer")


@dataclass
class Start:
    run: int
    machine: str
    label: str
    vanilla: bool
    state: str
    answered_s: float
    phases: list[tuple[str, float]]
    # the server ran with what a checkpoint needs (vLLM's sleep mode, a spawned engine core:
    # proof_ready.CHECKPOINT_ENV), not quite as it ships
    sleep_mode: bool = False
    # where its checkpoint kept the weights (serving.checkpoint_weights)
    weights: str = "host"

    def name(self) -> str:
        what = "vanilla vLLM" if self.vanilla else "image + checkpoint" if self.sleep_mode \
            else "image"
        if self.sleep_mode and self.weights == "files":
            what += " (weights from files)"
        return f"{what}, {self.state} ({self.machine})"


# a step's --set of these only places the servers (GPUs, ports): the render still as it ships
PLACEMENT = ("serving.gpu_ids=", "serving.base_port=", "router.internal_port=",
             "router.metrics_port=")
# what a server restored from its checkpoint runs with, --set on a tier that ships without it: a
# start of it is charted among the restored ones, not dropped as a variant
CHECKPOINTED = ("serving.checkpoint=true", "serving.engine_process=spawn",
                "serving.checkpoint_weights=files")


def starts(run: int, machine: str, proof: dict[str, Any]) -> list[Start]:
    """A machine's timed starts; a server run with sleep mode for a checkpoint (not as it ships)
    only where its checkpoint was restored; a variant (a step that --set a field of the profile)
    never: its record keeps it, the chart shows the render as it ships."""
    out = []
    commands = proof.get("commands") or {}
    for label, rec in (proof.get("ready") or {}).items():
        restored = [(rec.get("starts") or {}).get(s) or {} for s in RESTORED]
        if rec.get("sleep_mode") and not any("answered_s" in e for e in restored):
            continue
        sets = (commands.get(label) or {}).get("sets") or ()
        if not all(str(x).startswith(PLACEMENT) or (rec.get("sleep_mode") and x in CHECKPOINTED)
                   for x in sets):
            continue
        for state in rec.get("order", []):
            e = (rec.get("starts") or {}).get(state) or {}
            if "answered_s" in e:
                out.append(Start(run, machine, label, bool(rec.get("vanilla")), state,
                                 float(e["answered_s"]),
                                 [(str(n), float(s)) for n, s in e.get("phases", [])],
                                 bool(rec.get("sleep_mode")),
                                 "files" if "serving.checkpoint_weights=files" in sets
                                 else "host"))
    return out


# a start the chart keeps from an older run when the newest timed none: what a first boot from an
# image with a warm-cache bundle makes (a same-call cold pair should not hide it)
CARRIED = ("bundle",)


def newest(found: list[Start]) -> list[Start]:
    """The newest run's starts as the render ships, vanilla first, then cold, warm, bundle, and
    below them the newest run's that restored a checkpoint; a run's machines each keep theirs (a
    bundle made on one machine is restored on another). A state of CARRIED the newest run did not
    time comes from the newest run that did; each row names its run."""
    out: list[Start] = []
    for group in ([s for s in found if not s.sleep_mode], [s for s in found if s.sleep_mode]):
        if not group:
            continue
        run = max(s.run for s in group)
        keep = [s for s in group if s.run == run]
        for state in CARRIED:
            older = [s for s in group if s.state == state and not s.vanilla]
            if older and not any(s.state == state and not s.vanilla for s in keep):
                last = max(s.run for s in older)
                keep += [s for s in older if s.run == last]
        out += sorted(keep, key=lambda s: (not s.vanilla,
                                           READY_STARTS.index(s.state) if s.state in READY_STARTS
                                           else 9,
                                           s.machine))
    return out


def table(rows: list[Start]) -> str:
    """Markdown: a row a start, a column a phase any of them passed (ORDER)."""
    seen = {n for s in rows for n, _ in s.phases}
    cols = [p for p in ORDER if p in seen or p in PHASES.values()]
    head = "| start | first answer, s | " + " | ".join(cols) + " |\n"
    head += "|---|---|" + "---|" * len(cols) + "\n"
    for s in rows:
        ph = dict(s.phases)
        head += (f"| {markdown_text(s.name())}, run {s.run} | {s.answered_s:.1f} | "
                 + " | ".join(f"{ph[p]:.1f}" if p in ph else "-" for p in cols) + " |\n")
    return head


def pyplot() -> Any:
    """matplotlib's pyplot, set for the ledger's deterministic SVG charts (no display, a fixed
    hash salt, text as text)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a record's names are drawn as written: `$...$` in one is no mathtext to parse (or fail on)
    plt.rcParams.update({"svg.hashsalt": "inference-image", "svg.fonttype": "none",
                         "font.size": 9, "text.parse_math": False})
    return plt


def svg_text(fig: Any, **savefig: Any) -> str:
    """The figure as SVG text without a date (the same chart, the same bytes); the figure closed."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, **savefig)
    pyplot().close(fig)
    return buf.getvalue()


def svg(tier: str, rows: list[Start]) -> str:
    """A horizontal stacked bar a start, its phases left to right; deterministic SVG."""
    plt = pyplot()
    colors = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.4 * len(rows)))
    labels = [s.name() for s in rows]
    for i, phase in enumerate(ORDER):
        lefts, widths = [], []
        for s in rows:
            before = 0.0
            for name, sec in s.phases:
                if name == phase:
                    break
                before += sec
            lefts.append(before)
            widths.append(dict(s.phases).get(phase, 0.0))
        ax.barh(labels, widths, left=lefts, color=colors[i % len(colors)], label=phase,
                height=0.6)
    for y, s in enumerate(rows):
        ax.text(s.answered_s + 1, y, f"{s.answered_s:.0f} s", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the process start to the first answer")
    runs = ", ".join(str(r) for r in dict.fromkeys(s.run for s in rows))
    ax.set_title(f"{tier}: where a start's time goes (run {runs}, page cache dropped before "
                 "cold, bundle and checkpoint starts)", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_xlim(0, max(s.answered_s for s in rows) * 1.12)
    fig.tight_layout()
    return svg_text(fig, bbox_inches="tight")
