"""`inference-image bench compare A B`: two results side by side, B/A for each row both hold. A
result is what `bench run` wrote, a proof record under docs/benchmarks/ or one machine's
proof.json; each is read through the one JSON reader and its rows typed (BenchRow)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inference_machine.inputs import InputError, read_json


def compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Side-by-side ratios B/A for rows present in both: matched by scenario and concurrency where
    each file holds one configuration, else by configuration too (a file of several holds a row
    of each at one concurrency, and a row is never set against another configuration's)."""
    configs = [{r.get("config", "") for r in d["runs"]} for d in (a, b)]
    by_config = any(len(c) > 1 for c in configs)

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return ((r.get("config", ""),) if by_config else ()) + (r["scenario"], r["concurrency"])
    ia = {key(r): r for r in a["runs"]}
    lines = ["| config | scenario | c | A tok/s | B tok/s | B/A | A TTFT p99 ms | B TTFT p99 ms "
             "| B/A |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in b["runs"]:
        x = ia.get(key(r))
        if not x:
            continue
        tr = r["output_tok_s"] / x["output_tok_s"] if x["output_tok_s"] else float("nan")
        lr = r["ttft_ms_p99"] / x["ttft_ms_p99"] if x["ttft_ms_p99"] else float("nan")
        lines.append(f"| {r.get('config', '')} | {r['scenario']} | {r['concurrency']} "
                     f"| {x['output_tok_s']:.1f} "
                     f"| {r['output_tok_s']:.1f} | {tr:.2f}x | {x['ttft_ms_p99']:.1f} "
                     f"| {r['ttft_ms_p99']:.1f} | {lr:.2f}x |")
    if len(lines) == 2:
        return ("no configuration/scenario/concurrency row is in both files" if by_config
                else "no scenario/concurrency pair is in both files")
    return "\n".join(lines)


def _proof_rows(doc: Any, path: str, machine: str) -> Any:
    """The bench rows of a proof record (docs/benchmarks/*-proof-run*.json, as the README links
    them) or of one machine's proof.json, as a result of `bench run` holds them; other
    documents as they are. A record's machines are never mixed: one that holds rows of several
    needs FILE#MACHINE."""
    if isinstance(doc, dict) and doc.get("kind") == "proof" and isinstance(doc.get("machines"), dict):
        rows = {n: m for n, m in doc["machines"].items() if isinstance(m, dict) and m.get("runs")}
        if machine:
            if machine not in rows:
                raise ValueError(f"{path}: no machine {machine!r} with bench rows (it has: "
                                 f"{', '.join(rows) or 'none'})")
            doc = rows[machine]
        elif len(rows) == 1:
            doc = next(iter(rows.values()))
        else:
            raise ValueError(f"{path}: bench rows of {len(rows)} machines ({', '.join(rows) or '-'})"
                             f"; rows of two machines are never compared. Fix: name one as "
                             f"{path}#MACHINE")
    elif machine:
        raise ValueError(f"{path}#{machine}: only a proof record names machines")
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if isinstance(runs, dict):  # a proof's rows, by configuration
        doc = {**doc, "runs": [{**r, "config": r.get("config") or label}
                               for label, rs in runs.items() if isinstance(rs, list)
                               for r in rs if isinstance(r, dict)]}
    return doc


def _bench_file(path: str) -> dict[str, Any]:
    """A result of `bench run`, a proof record or a machine's proof.json (FILE#MACHINE picks one
    machine of a record): InputError or ValueError with what is wrong."""
    machine = ""
    if "#" in path and not Path(path).exists():
        path, machine = path.rsplit("#", 1)
    try:
        doc = read_json(Path(path), "result", 64 * 2**20, "pass a JSON file written by `bench run`")
    except InputError as exc:
        raise ValueError(str(exc)) from None
    doc = _proof_rows(doc, path, machine)
    runs = doc.get("runs") if isinstance(doc, dict) else None
    need = ("scenario", "concurrency", "output_tok_s", "ttft_ms_p99")
    if not isinstance(runs, list) or not runs or not all(
            isinstance(r, dict) and all(k in r for k in need) for r in runs):
        raise ValueError(f"{path}: not a result of `bench run` or a proof record with bench rows "
                         f"(want rows that have {', '.join(need)}). Fix: pass the .json `bench "
                         "run` wrote, or a record under docs/benchmarks/")
    for i, r in enumerate(runs):
        try:
            BenchRow.model_validate(r)
        except ValidationError as exc:
            e = exc.errors()[0]
            raise ValueError(f"{path}: row {i}: {'.'.join(map(str, e['loc']))} "
                             f"{e.get('input')!r:.60}: {e['msg']}. Fix: pass the .json `bench "
                             "run` wrote, or a record under docs/benchmarks/") from None
    return doc


class BenchRow(BaseModel):
    """What `bench compare` reads of a row: finite figures, a scenario, a concurrency and a
    configuration that are names and numbers."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    config: str = Field("", max_length=200, description="the row's configuration label")
    scenario: str = Field(max_length=200, description="the scenario's name")
    concurrency: int = Field(ge=1, le=1_000_000, description="requests in flight")
    output_tok_s: float = Field(ge=0, description="output tokens a second")
    ttft_ms_p99: float | None = Field(ge=0, description="time to first token, p99, ms")


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        a, b = (_bench_file(p) for p in (args.a, args.b))
    except (InputError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"A = {args.a}\nB = {args.b}\n" + compare(a, b))
    return 0
