"""The evidence ledger: docs/benchmarks.md and its charts, written from the records under
docs/benchmarks/ (`inference-lab ledger --write`; without it, says whether they are current).

Every record is of one schema (`Record`); a proof's every chat row of every served configuration
is one series. A series is the image "as it ships"
when its profile digest is the tier's current one, or differs from it only where the server was
placed on the machine (PLACEMENT). Which series each tier's chart sets against which is chosen in
docs/benchmarks/charts.json, with the reason for any row left out of a chart."""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_image.profiles import ProfileErrors, list_tiers, project_root, resolve
from inference_machine.inputs import InputError, printable, read_json
from inference_machine.writers import markdown_link, markdown_text

from . import ready_chart
from .proof_plan import READY_STARTS
from .ready_chart import PLACEMENT

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
SCHEMA = 1
# record kinds, in the order the page lists them, with their section's heading
KINDS = {"proof": "Runs on GPUs", "layout": "Layouts", "gemm-table": "FP8 GEMM tables",
         "faults": "Faults under load", "soak": "Soak", "multinode": "Multi-node",
         "fleet": "Fleet", "build": "Builds", "systemd": "The image under systemd on a GPU"}
# --set fields that place a server on the machine and change nothing it serves
IMAGE, VANILLA = "#1f6feb", "#8c959f"
SHADES = ("#1f6feb", "#54aeff", "#0a3069")


class LedgerError(Exception):
    """A record or chart selection the ledger cannot read, with the fix."""


@dataclass
class Series:
    run: int
    date: str
    record: str
    machine: str
    tier: str
    label: str
    kind: str  # "image" or "vanilla"
    as_ships: bool
    acceptance: float | None
    gpu: str
    rows: dict[int, dict[str, float]] = field(default_factory=dict)

    def config(self) -> str:
        if self.kind == "vanilla":
            return f"vanilla vLLM ({self.label})"
        what = "as it ships" if self.as_ships else "changed"
        return f"{what} ({self.label})" + (f", acceptance {self.acceptance:g}"
                                           if self.acceptance else "")


@dataclass
class Record:
    """One file under docs/benchmarks/, of schema 1: `{"schema": 1, "kind", "date", "title",
    "note"}` and, for a proof, `"run"`, `"tiers": {MACHINE: TIER}` and `"machines": {MACHINE:
    proof.json}`; for every other kind, what was measured under `"data"`."""
    name: str
    kind: str
    date: str
    title: str
    note: str
    run: int | None
    doc: dict[str, Any]

    def heading(self) -> str:
        """Its heading on docs/benchmarks.md, which GitHub links as `anchor()`."""
        return f"Run {self.run}" if self.run is not None else Path(self.name).stem

    def anchor(self) -> str:
        return self.heading().lower().replace(" ", "-")


def shipped_digest(tier: str, sets: tuple[str, ...], cache: dict[tuple[str, tuple[str, ...]],
                                                          str | None]) -> str | None:
    """The digest the tier as it ships has with `sets` (placement only) applied; None where the
    tier does not resolve with them (gone, or changed since)."""
    key = (tier, sets)
    if key not in cache:
        try:
            cache[key] = resolve(tier, overrides=list(sets)).digest
        except ProfileErrors:  # the tier is gone or changed: not this profile as it ships
            cache[key] = None
    return cache[key]


def check(name: str, doc: Any) -> Record:
    """One record read against the schema; a LedgerError names the file, the field and the fix."""
    def bad(field_: str, why: str, fix: str) -> LedgerError:
        return LedgerError(f"{name}: {field_} {why}. Fix: {fix}")
    if not isinstance(doc, dict):
        raise bad("the record", "is not a JSON object", "write one object of schema 1")
    if doc.get("schema") != SCHEMA:
        raise bad("schema", f"is {doc.get('schema')!r}, not {SCHEMA}", f'set "schema": {SCHEMA}')
    kind = doc.get("kind")
    if kind not in KINDS:
        raise bad("kind", f"is {kind!r}", "one of " + ", ".join(KINDS))
    date = doc.get("date")
    if not isinstance(date, str) or not re.fullmatch(r"\d{4}-\d\d-\d\d", date) or not \
            name.startswith(date):
        raise bad("date", f"is {date!r}", "the day it was measured, YYYY-MM-DD, which the file "
                  "name starts with")
    for key in ("title", "note"):
        if not isinstance(doc.get(key), str) or not doc[key].strip():
            raise bad(key, "is missing or empty", f"say in one {'line' if key == 'title' else 'paragraph'} "
                      "what was measured, on what and how")
    run = doc.get("run")
    if kind == "proof":
        if not isinstance(run, int) or isinstance(run, bool) or run < 1:
            raise bad("run", f"is {run!r}", "the run's number, a positive integer")
        machines, tiers = doc.get("machines"), doc.get("tiers")
        if not isinstance(machines, dict) or not machines or not all(
                isinstance(m, dict) for m in machines.values()):
            raise bad("machines", "is not an object of proof documents", "one proof.json per "
                      "machine, by the machine's name")
        if not isinstance(tiers, dict) or set(tiers) != set(machines):
            raise bad("tiers", "does not name a tier for each machine", "one tier per machine")
        for machine, proof in machines.items():
            if (why := ready_problem(proof.get("ready"))) is not None:
                field_, what = why
                raise bad(f"machines.{printable(machine, 60)}.ready{field_}", what,
                          "write it as `inference-lab proof step ready` does: {LABEL: {\"order\": "
                          "[START...], \"starts\": {START: {\"answered_s\": SECONDS, \"phases\": "
                          "[[NAME, SECONDS]...]}}}}")
    else:
        if run is not None:
            raise bad("run", "is set on a record that is not a proof", "leave it out")
        if not isinstance(doc.get("data"), dict):
            raise bad("data", "is not an object", "put what was measured under \"data\"")
    return Record(name, kind, date, doc["title"].strip(), " ".join(doc["note"].split()), run, doc)


def _seconds_problem(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"is {printable(repr(v), 40)}, not a number of seconds"
    if not math.isfinite(v) or v < 0:
        return f"is {v!r}, not a finite number of seconds of 0 or more"
    return None


def ready_problem(ready: Any) -> tuple[str, str] | None:
    """Where a proof's `ready` (proof_ready's starts, the ready table's rows) is not what the
    lab writes, and what is wrong: (the field under it, why); None when it is (or is absent)."""
    if ready is None:
        return None
    if not isinstance(ready, dict):
        return "", "is not an object"
    for label, rec in ready.items():
        at = f".{printable(label, 60)}"
        if not isinstance(rec, dict):
            return at, "is not an object"
        order, starts = rec.get("order", []), rec.get("starts", {})
        if not isinstance(order, list) or not all(x in READY_STARTS for x in order):
            return f"{at}.order", f"is not a list of start names ({', '.join(READY_STARTS)})"
        if not isinstance(starts, dict) or not all(isinstance(e, dict) for e in starts.values()):
            return f"{at}.starts", "is not an object of starts"
        if unknown := [k for k in starts if k not in READY_STARTS]:
            return f"{at}.starts", (f"names {printable(repr(unknown[0]), 60)}, not a start the "
                                    f"lab times ({', '.join(READY_STARTS)})")
        for state, e in starts.items():
            where = f"{at}.starts.{printable(state, 60)}"
            if "answered_s" in e and (why := _seconds_problem(e["answered_s"])):
                return f"{where}.answered_s", why
            phases = e.get("phases", [])
            if not isinstance(phases, list):
                return f"{where}.phases", "is not a list of [name, seconds]"
            for ph in phases:
                if not (isinstance(ph, list) and len(ph) == 2 and isinstance(ph[0], str)):
                    return f"{where}.phases", f"holds {printable(repr(ph), 60)}, not [name, seconds]"
                if why := _seconds_problem(ph[1]):
                    return f"{where}.phases.{printable(ph[0], 40)}", why
    return None


def records(path: Path) -> list[Record]:
    """Every record under `path`, checked; run numbers are each one record's."""
    out: list[Record] = []
    seen: dict[int, str] = {}
    for p in sorted(path.glob("*.json")):
        if p.name == "charts.json":
            continue
        try:
            doc = read_json(p, "record", 64 * 2**20, "write the record as JSON")
        except InputError as exc:
            raise LedgerError(str(exc)) from None
        rec = check(p.name, doc)
        if rec.run is not None:
            if rec.run in seen:
                raise LedgerError(f"{p.name}: run {rec.run} is also {seen[rec.run]}'s. Fix: one "
                                  "record a run (put its machines under one \"machines\")")
            seen[rec.run] = p.name
        out.append(rec)
    return out


def load(path: Path, shipped: dict[str, str] | None = None) -> tuple[list[Series], list[Record]]:
    """Every chat series of every proof record, and every record."""
    recs = records(path)
    series: list[Series] = []
    cache: dict[tuple[str, tuple[str, ...]], str | None] = {}
    for rec in recs:
        if rec.kind != "proof":
            continue
        run = rec.run or 0
        for name, proof in rec.doc["machines"].items():
            tier = proof.get("tier") or rec.doc["tiers"].get(name, "")
            commands = proof.get("commands") or {}
            for label, rows in (proof.get("runs") or {}).items():
                # a ready step's rows are named after their start (h100-bundle), its command not
                base = label.removesuffix("-direct")
                step = re.sub(rf"-({'|'.join(READY_STARTS)})$", "", base)
                cmd = commands.get(label) or commands.get(base) or commands.get(step)
                if not isinstance(cmd, dict) or not isinstance(rows, list):
                    continue
                sha = cmd.get("profile_sha256")
                sets = tuple(cmd.get("sets") or ())
                # a server run for a checkpoint (sleep mode, a spawned engine) is not as it ships
                sleep_mode = bool(((proof.get("ready") or {}).get(step) or {}).get("sleep_mode"))
                ships = bool(sha) and not sleep_mode and all(
                    x.startswith(PLACEMENT) for x in sets) and (
                    sha == shipped_digest(tier, sets, cache)
                    or f"{run}/{name}/{label}" in (shipped or {}))
                s = Series(run, rec.date, rec.name, name, tier, label,
                           "image" if sha else "vanilla", ships, cmd.get("acceptance_length"),
                           (proof.get("info") or {}).get("gpu", ""))
                for row in rows:
                    if row.get("scenario", "chat") == "chat" and row.get("concurrency") in CONCURRENCY:
                        s.rows[row["concurrency"]] = {"tok_s": row["output_tok_s"],
                                                      "ttft": row.get("ttft_ms_mean", 0.0)}
                if s.rows:
                    series.append(s)
    series.sort(key=lambda s: (-s.run, s.machine, s.label))
    return series, recs


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:,.1f}"


def table(tier: str, series: list[Series]) -> str:
    head = ("| run | machine (GPU) | configuration | "
            + " | ".join(f"c={c}" for c in CONCURRENCY) + " |\n|---|---|---|"
            + "---|" * len(CONCURRENCY) + "\n")
    body = "".join(
        f"| {markdown_link(s.run, f'benchmarks/{s.record}')} | {_md(s.machine)}"
        + (f" ({_md(s.gpu.removeprefix('NVIDIA '))})" if s.gpu else "") + " | "
        f"{_md(s.config())} | "
        + " | ".join(_fmt(s.rows.get(c, {}).get("tok_s")) for c in CONCURRENCY) + " |\n"
        for s in series if s.tier == tier)
    return head + body


# ---- charts -----------------------------------------------------------------------------------

def svg(title: str, panels: list[tuple[str, str, list[tuple[str, str, bool, dict[int, float]]]]],
        note: str) -> str:
    """Panels side by side, each (title, unit, lines); a line is (name, colour, dashed,
    {concurrency: y}), x on a log-2 axis of the chart concurrencies, y from 0; one legend and the
    note under them. Drawn by matplotlib, deterministic (no date, a fixed hash salt)."""
    plt = ready_chart.pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.4, 3.6),
                             squeeze=False)
    for ax, (ptitle, unit, lines) in zip(axes[0], panels, strict=True):
        for name, colour, dashed, pts in lines:
            cs = sorted(pts)
            if cs:
                ax.plot(cs, [pts[c] for c in cs], color=colour, linestyle="--" if dashed else "-",
                        marker="o", markersize=3, linewidth=1.8, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(CONCURRENCY), [str(c) for c in CONCURRENCY])
        ax.set_ylim(bottom=0)
        ax.set_title(ptitle, fontsize=9, fontweight="bold", loc="left")
        ax.set_ylabel(unit)
        ax.set_xlabel("concurrent requests")
        ax.grid(axis="y", color="#d0d7de", linewidth=0.8)
        ax.spines[["top", "right"]].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.01, 0.0), frameon=False,
               fontsize=8)
    fig.text(0.01, -0.04 - 0.045 * len(labels), "\n".join(textwrap.wrap(note, 48 * len(panels))),
             fontsize=8, color="#57606a", va="top")
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return ready_chart.svg_text(fig, bbox_inches="tight")


@dataclass
class Chart:
    tier: str
    run: int
    image: list[Series]
    vanilla: list[Series]
    left_out: dict[str, list[int]]  # series label -> concurrencies left out
    why: str

    def points(self, s: Series, key: str) -> dict[int, float]:
        drop = set(self.left_out.get(s.label, []))
        return {c: v[key] for c, v in s.rows.items() if c not in drop}

    def best_vanilla(self, key: str) -> dict[int, float]:
        """The faster vanilla where several starts served a row (tok/s: the highest; TTFT: the
        TTFT of that start)."""
        out: dict[int, tuple[float, float]] = {}
        for s in self.vanilla:
            for c, tok in self.points(s, "tok_s").items():
                if c not in out or tok > out[c][0]:
                    out[c] = (tok, s.rows[c]["ttft"])
        return {c: (v[0] if key == "tok_s" else v[1]) for c, v in out.items()}

    def speedup(self) -> dict[int, float]:
        img, van = self.points(self.image[0], "tok_s"), self.best_vanilla("tok_s")
        return {c: img[c] / van[c] for c in img if c in van and van[c] > 0}


def charts(series: list[Series], selection: dict[str, Any]) -> list[Chart]:
    out = []
    for tier, sel in selection.items():
        if tier.startswith("_"):
            continue

        def pick(which: str, sel: dict[str, Any] = sel, tier: str = tier) -> list[Series]:
            got = []
            for machine, label in sel[which]:
                found = [s for s in series if s.run == sel["run"] and s.machine == machine
                         and s.label == label]
                if not found:
                    raise LedgerError(f"charts.json {tier}.{which}: run {sel['run']} has no "
                                      f"series {label!r} on machine {machine!r}. Fix: name one "
                                      "the record holds")
                got += found
            return got
        out.append(Chart(tier, sel["run"], pick("image"), pick("vanilla"),
                         sel.get("left_out", {}), sel.get("why", "")))
    return out


def chart_svg(ch: Chart) -> str:
    gpu = ch.image[0].gpu.removeprefix("NVIDIA ")
    lines_tok = [(f"image, {s.config()} ({s.machine})", SHADES[i % 3], False,
                  ch.points(s, "tok_s")) for i, s in enumerate(ch.image)]
    lines_ttft = [(n, c, d, ch.points(s, "ttft")) for (n, c, d, _), s in zip(lines_tok, ch.image,
                                                                              strict=True)]
    van = ", ".join(s.label for s in ch.vanilla)
    lines_tok.append((f"vanilla vLLM ({van})", VANILLA, True, ch.best_vanilla("tok_s")))
    lines_ttft.append((f"vanilla vLLM ({van})", VANILLA, True, ch.best_vanilla("ttft")))
    note = f"run {ch.run} on {gpu}, chat 512/512, random weights, acceptance set" + (
        f"; {ch.why}" if ch.why else "")
    return svg(f"{ch.tier}: the image against vanilla vLLM",
               [(f"{ch.tier}: output tok/s", "tok/s", lines_tok),
                (f"{ch.tier}: time to first token, mean", "ms", lines_ttft)], note)


def speedup_svg(chs: list[Chart]) -> str:
    lines = [(f"{ch.tier} (run {ch.run}, {ch.image[0].gpu.removeprefix('NVIDIA ')})",
              SHADES[i % 3] if i < 3 else "#bf8700", False, ch.speedup())
             for i, ch in enumerate(chs)]
    return svg("The image against vanilla vLLM on the same GPUs",
               [("image / vanilla, output tok/s", "x vanilla", lines)],
               "random weights, each draft's published acceptance set; docs/benchmarks.md")


def _machines(rec: Record) -> str:
    parts = []
    for name, proof in rec.doc["machines"].items():
        gpu = str((proof.get("info") or {}).get("gpu", "")).removeprefix("NVIDIA ")
        parts.append(f"{name} ({gpu})" if gpu else name)
    return markdown_text(", ".join(parts))


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return " / ".join(_cell(x) for x in v)
    if isinstance(v, float):
        return f"{v:,.2f}".rstrip("0").rstrip(".")
    if isinstance(v, int):
        return f"{v:,}"
    return _md(v)


def _md(v: object) -> str:
    """Text from a record in a table cell or a heading: text alone (writers.markdown_text)."""
    return markdown_text(v, 500)


def data_table(data: dict[str, Any]) -> str:
    """A record's rows (`data.rows` or `data.tries`, a list of objects) as one table; "" if none."""
    rows = data.get("rows") or data.get("tries")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return ("| " + " | ".join(_md(k.replace("_", " ")) for k in keys) + " |\n|" + "---|" * len(keys)
            + "\n" + "".join("| " + " | ".join(_cell(r[k]) if k in r else "" for k in keys)
                             + " |\n" for r in rows))


def benchmarks_md(series: list[Series], recs: list[Record], chs: list[Chart],
                  tiers: list[str], ready: dict[str, list[ready_chart.Start]] | None = None) -> str:
    out = ["# Benchmarks: every measured configuration, and every record\n",
           "Written by `inference-lab ledger --write` (`make evidence`) from the records under "
           "[docs/benchmarks/](benchmarks/); do not edit by hand. Each table row is one "
           "configuration served in one run: output tok/s at each chat concurrency (512 in, 512 "
           "out; random weights of the real shapes; a draft's acceptance set to the figure in its "
           "row). \"As it ships\": the tier's profile as it is now, placed on the machine as the "
           "run needed. What each figure decided is on the tier pages under [tiers/](tiers/) and "
           "in [decisions.md](decisions.md).\n",
           "![The image against vanilla vLLM, per tier](charts/speedup.svg)\n"]
    charted = {ch.tier: ch for ch in chs}
    ready = ready or {}
    for tier in tiers:
        if not any(s.tier == tier for s in series) and tier not in ready:
            continue
        out.append(f"## {tier}\n")
        if tier in charted:
            out.append(f"![{tier}: the image against vanilla vLLM](charts/{tier}.svg)\n")
        if any(s.tier == tier for s in series):
            out.append(table(tier, series))
        if tier in ready:
            out.append(f"### {tier}: ready time\n\nSeconds from the process start to the first "
                       "answer, phase by phase (`inference-lab proof step ready`; phases: "
                       "`inference_machine.MOMENTS`).\n")
            out.append(f"![{tier}: where a start's time goes](charts/{tier}-ready.svg)\n")
            out.append(ready_chart.table(ready[tier]))
    for kind, heading in KINDS.items():
        these = sorted((r for r in recs if r.kind == kind),
                       key=lambda r: (r.date, r.run or 0, r.name), reverse=True)
        if not these:
            continue
        out.append(f"## {heading}\n")
        for r in these:
            where = f" · {_machines(r)}" if kind == "proof" else ""
            out.append(f"### {markdown_text(r.heading())}\n\n**{markdown_text(r.title)}** · "
                       f"{r.date}{where} · {markdown_link('record', f'benchmarks/{r.name}')}"
                       f"\n\n{markdown_text(r.note, 100_000)}\n")
            if kind != "proof" and (rows := data_table(r.doc["data"])):
                out.append(rows)
    return "\n".join(out)


def ready_starts(recs: list[Record]) -> dict[str, list[ready_chart.Start]]:
    """Each tier's starts of its newest `ready` run (ready_chart.newest)."""
    found: dict[str, list[ready_chart.Start]] = {}
    for rec in recs:
        if rec.kind != "proof":
            continue
        for name, proof in rec.doc["machines"].items():
            tier = proof.get("tier") or rec.doc["tiers"].get(name, "")
            found.setdefault(tier, []).extend(ready_chart.starts(rec.run or 0, name, proof))
    return {t: rows for t, found_t in found.items() if (rows := ready_chart.newest(found_t))}


def outputs(root: Path) -> dict[Path, str]:
    docs = root / "docs"
    tiers = list_tiers(root / "profiles")
    try:
        selection = read_json(docs / "benchmarks" / "charts.json", "charts.json", 2**20,
                              "write the chart selection as JSON")
    except InputError as exc:
        raise LedgerError(str(exc)) from None
    series, recs = load(docs / "benchmarks", selection.get("_serves_as_it_ships", {}))
    chs = charts(series, selection)
    ready = ready_starts(recs)
    files = {docs / "benchmarks.md": benchmarks_md(series, recs, chs, tiers, ready),
             docs / "charts" / "speedup.svg": speedup_svg(chs)}
    files |= {docs / "charts" / f"{ch.tier}.svg": chart_svg(ch) for ch in chs}
    files |= {docs / "charts" / f"{t}-ready.svg": ready_chart.svg(t, rows)
              for t, rows in ready.items()}
    return files


def run_ledger(args: argparse.Namespace) -> int:
    try:
        files = outputs(project_root())
    except (LedgerError, OSError, ValueError) as exc:
        print(f"ledger: {exc}", file=sys.stderr)
        return 1
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
    if args.write:
        for p in stale:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(files[p])
        print(f"ledger: {len(stale)} of {len(files)} files written "
              f"({', '.join(str(p.relative_to(project_root())) for p in stale) or 'none changed'})")
        return 0
    if stale:
        print("ledger: out of date: " + ", ".join(str(p.relative_to(project_root()))
                                                  for p in stale)
              + ". Fix: inference-lab ledger --write")
        return 1
    print(f"ledger: {len(files)} files current")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    lp = sub.add_parser("ledger", help="write docs/benchmarks.md and docs/charts/ from the records")
    lp.add_argument("--write", action="store_true", help="write them (default: check only)")
    lp.set_defaults(func=run_ledger)
