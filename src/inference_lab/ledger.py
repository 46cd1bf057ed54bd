"""The evidence ledger: docs/results.md and its charts, written from the records under
docs/benchmarks/ (`inference-lab ledger --write`; `--check` says whether they are current).

A record of the proof's shape is `{"run", "date", "note", "machines": {NAME: proof.json}}`; every
chat row of every served configuration in it is one series. A series is the image "as it ships"
when its profile digest is the tier's current one, or differs from it only where the server was
placed on the machine (PLACEMENT). Which series each tier's chart sets against which is chosen in
docs/benchmarks/charts.json, with the reason for any row left out of a chart."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_image.profiles import ProfileErrors, list_tiers, project_root, resolve

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
# --set fields that place a server on the machine and change nothing it serves
PLACEMENT = ("serving.gpu_ids=", "serving.base_port=", "router.internal_port=",
             "router.metrics_port=")
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


def _run_number(path: Path, doc: dict[str, Any]) -> int | None:
    run = doc.get("run")
    if isinstance(run, int):
        return run
    m = re.search(r"run(\d+)", path.stem)
    return int(m[1]) if m else None


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


def load(records: Path, shipped: dict[str, str] | None = None) -> tuple[list[Series], list[str]]:
    """Every chat series of every record of the proof's shape, and the records of other shapes."""
    series: list[Series] = []
    other: list[str] = []
    cache: dict[tuple[str, tuple[str, ...]], str | None] = {}
    for path in sorted(records.glob("*.json")):
        if path.name == "charts.json":
            continue
        doc = json.loads(path.read_text())
        run = _run_number(path, doc) if isinstance(doc, dict) else None
        machines = doc.get("machines") if isinstance(doc, dict) else None
        if run is None or not isinstance(machines, dict):
            other.append(path.name)
            continue
        for name, proof in machines.items():
            if not isinstance(proof, dict):
                continue
            tier = proof.get("tier") or (doc.get("tiers") or {}).get(name, "")
            commands = proof.get("commands") or {}
            for label, rows in (proof.get("runs") or {}).items():
                cmd = commands.get(label) or commands.get(label.removesuffix("-direct"))
                if not isinstance(cmd, dict) or not isinstance(rows, list):
                    continue
                sha = cmd.get("profile_sha256")
                sets = tuple(cmd.get("sets") or ())
                ships = bool(sha) and all(x.startswith(PLACEMENT) for x in sets) and (
                    sha == shipped_digest(tier, sets, cache)
                    or f"{run}/{name}/{label}" in (shipped or {}))
                s = Series(run, str(doc.get("date", "")), path.name, name, tier, label,
                           "image" if sha else "vanilla", ships, cmd.get("acceptance_length"),
                           (proof.get("info") or {}).get("gpu", ""))
                for row in rows:
                    if row.get("scenario", "chat") == "chat" and row.get("concurrency") in CONCURRENCY:
                        s.rows[row["concurrency"]] = {"tok_s": row["output_tok_s"],
                                                      "ttft": row.get("ttft_ms_mean", 0.0)}
                if s.rows:
                    series.append(s)
    series.sort(key=lambda s: (-s.run, s.machine, s.label))
    return series, other


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:,.1f}"


def table(tier: str, series: list[Series]) -> str:
    head = ("| run | machine (GPU) | configuration | "
            + " | ".join(f"c={c}" for c in CONCURRENCY) + " |\n|---|---|---|"
            + "---|" * len(CONCURRENCY) + "\n")
    body = "".join(
        f"| [{s.run}](benchmarks/{s.record}) | {s.machine}"
        + (f" ({s.gpu.removeprefix('NVIDIA ')})" if s.gpu else "") + " | "
        f"{s.config()} | "
        + " | ".join(_fmt(s.rows.get(c, {}).get("tok_s")) for c in CONCURRENCY) + " |\n"
        for s in series if s.tier == tier)
    return head + body


# ---- charts -----------------------------------------------------------------------------------

def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(v))
    return next(m * p for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * p >= v)


def _panel(x0: float, title: str, unit: str, lines: list[tuple[str, str, bool, dict[int, float]]],
           w: float = 330, h: float = 230) -> list[str]:
    """One chart: x is concurrency (log 2), y from 0; lines (name, colour, dashed, {c: y})."""
    top, left, bottom = 40.0, 52.0, 30.0
    ymax = _nice_max(max((y for *_, pts in lines for y in pts.values()), default=1.0))
    pw, ph = w - left - 10, h - top - bottom

    def px(c: int) -> float:
        return x0 + left + pw * math.log2(c) / math.log2(CONCURRENCY[-1])

    def py(y: float) -> float:
        return top + ph * (1 - y / ymax)

    out = [f'<text x="{x0 + left}" y="16" class="t">{title}</text>',
           f'<text x="{x0 + 4}" y="{top - 8}" class="s">{unit}</text>']
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<line x1="{x0 + left}" x2="{x0 + left + pw}" y1="{py(y):.1f}" '
                   f'y2="{py(y):.1f}" class="g"/>')
        out.append(f'<text x="{x0 + left - 4}" y="{py(y) + 4:.1f}" class="s" '
                   f'text-anchor="end">{y:,.0f}</text>')
    for c in CONCURRENCY:
        out.append(f'<text x="{px(c):.1f}" y="{top + ph + 16}" class="s" '
                   f'text-anchor="middle">{c}</text>')
    out.append(f'<text x="{x0 + left + pw / 2}" y="{h - 2}" class="s" '
               'text-anchor="middle">concurrent requests</text>')
    for _, colour, dashed, pts in lines:
        cs = sorted(pts)
        if not cs:
            continue
        d = " ".join(f"{'M' if i == 0 else 'L'}{px(c):.1f},{py(pts[c]):.1f}"
                     for i, c in enumerate(cs))
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{px(c):.1f}" cy="{py(pts[c]):.1f}" r="2.5" fill="{colour}"/>'
                for c in cs]
    return out


def svg(title: str, panels: list[tuple[str, str, list[tuple[str, str, bool, dict[int, float]]]]],
        note: str) -> str:
    w = 340 * len(panels) + 10
    legend: dict[str, tuple[str, bool]] = {}
    parts: list[str] = []
    for i, (ptitle, unit, lines) in enumerate(panels):
        parts += _panel(340 * i, ptitle, unit, lines)
        for name, colour, dashed, _ in lines:
            legend.setdefault(name, (colour, dashed))
    ly = 246
    for name, (colour, dashed) in legend.items():
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        parts.append(f'<line x1="12" x2="36" y1="{ly}" y2="{ly}" stroke="{colour}" '
                     f'stroke-width="2"{dash}/>')
        parts.append(f'<text x="42" y="{ly + 4}" class="s">{_esc(name)}</text>')
        ly += 16
    width = (w - 24) // 6  # characters of 11 px text a line holds
    for line in textwrap.wrap(note, width):
        parts.append(f'<text x="12" y="{ly + 6}" class="s">{_esc(line)}</text>')
        ly += 14
    h = ly + 8
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" font-family="sans-serif" role="img">\n'
            f'<title>{_esc(title)}</title>\n<style>.t{{font-size:13px;font-weight:bold}}'
            '.s{font-size:11px;fill:#57606a}.g{stroke:#d0d7de;stroke-width:1}</style>\n'
            '<rect width="100%" height="100%" fill="#ffffff"/>\n' + "\n".join(parts) + "\n</svg>\n")


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
               "random weights, each draft's published acceptance set; docs/results.md")


def results_md(series: list[Series], other: list[str], chs: list[Chart], tiers: list[str]) -> str:
    out = ["# Results: every measured configuration, per tier\n",
           "Written by `inference-lab ledger --write` from the records under "
           "[docs/benchmarks/](benchmarks/); do not edit by hand. Each row is one configuration "
           "served in one run: output tok/s at each chat concurrency (512 in, 512 out; random "
           "weights of the real shapes; a draft's acceptance set to the figure in its row). "
           "\"As it ships\": the tier's profile as it is now, placed on the machine as the run "
           "needed. The narrative of each run is in [benchmarks.md](benchmarks.md); what each "
           "figure decided is on the tier pages under [tiers/](tiers/).\n",
           "![The image against vanilla vLLM, per tier](charts/speedup.svg)\n"]
    charted = {ch.tier: ch for ch in chs}
    for tier in tiers:
        if not any(s.tier == tier for s in series):
            continue
        out.append(f"## {tier}\n")
        if tier in charted:
            out.append(f"![{tier}: the image against vanilla vLLM](charts/{tier}.svg)\n")
        out.append(table(tier, series))
    if other:
        out.append("## Records of older shapes (not in the tables)\n")
        out.append(", ".join(f"[{n}](benchmarks/{n})" for n in other) + "\n")
    return "\n".join(out)


def outputs(root: Path) -> dict[Path, str]:
    docs = root / "docs"
    tiers = list_tiers(root / "profiles")
    selection = json.loads((docs / "benchmarks" / "charts.json").read_text())
    series, other = load(docs / "benchmarks", selection.get("_serves_as_it_ships", {}))
    chs = charts(series, selection)
    files = {docs / "results.md": results_md(series, other, chs, tiers),
             docs / "charts" / "speedup.svg": speedup_svg(chs)}
    files |= {docs / "charts" / f"{ch.tier}.svg": chart_svg(ch) for ch in chs}
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
    lp = sub.add_parser("ledger", help="write docs/results.md and docs/charts/ from the records")
    lp.add_argument("--write", action="store_true", help="write them (default: check only)")
    lp.set_defaults(func=run_ledger)
