"""`inference-lab proof`: plan, run, step and record on the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from inference_image.ops import bench
from inference_image.profiles import (
    ProfileErrors,
    resolve,
)
from inference_image.schema import acceptance_problem, bad_scenario_spec
from inference_machine.inputs import InputError, read_json, read_text

from .proof import Runner
from .proof_plan import (
    CHAT_CONCURRENCY,
    FP8_STANDIN,
    FP8_TABLES,
    KINDS,
    READY_STARTS,
    SAMPLING_SOURCES,
    Plan,
    ProofError,
    Step,
    layout_plan,
    standard_plan,
    step_problem,
    vanilla_step,
)
from .proof_report import assemble

# ---- command line -----------------------------------------------------------------------------

def _floats(s: str) -> list[float]:
    return bench.comma_list(s, float, "an acceptance length is >= 1 (1 = no draft token accepted)")


def _rates(s: str) -> list[float]:
    try:
        rates = [float(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: give comma-separated shares 0-1") from None
    problem = "give at least one" if not rates else acceptance_problem(rates)
    if problem:
        raise argparse.ArgumentTypeError(f"{s}: {problem}")
    return rates


def _scenario(s: str) -> str:
    if why := bad_scenario_spec([s]):
        raise argparse.ArgumentTypeError(why)
    return s


MAX_CPUS = 4096  # Linux's CPU numbers on the largest machines it is built for


def _cpus(s: str) -> list[int]:
    """An argparse type: CPU numbers as taskset writes them (12,13 or 12-15)."""
    cpus: set[int] = set()
    try:
        for part in s.split(",")[:MAX_CPUS]:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if not 0 <= first <= last < MAX_CPUS:  # a range is checked before it is spread
                raise ValueError
            cpus.update(range(first, last + 1))
    except ValueError:
        cpus = set()
    if not cpus:
        raise argparse.ArgumentTypeError(f"{s!r}: give CPU numbers 0-{MAX_CPUS - 1}, e.g. 14,15 "
                                         "or 12-15")
    return sorted(cpus)


def _date(s: str) -> str:
    """An argparse type: a calendar date as YYYY-MM-DD, which names a record's file."""
    try:
        if time.strftime("%Y-%m-%d", time.strptime(s, "%Y-%m-%d")) == s:
            return s
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{s!r}: give a date as YYYY-MM-DD, e.g. 2026-11-29")


def _starts(s: str) -> list[str]:
    starts = [x for x in s.split(",") if x]
    if not starts or any(x not in READY_STARTS for x in starts):
        raise argparse.ArgumentTypeError(f"{s!r}: give some of {','.join(READY_STARTS)}")
    return starts


def _rates_arg(s: str) -> str:
    if s != "published":
        _rates(s)
    return s


def _folder_arg(s: str) -> str:
    """A folder the lab writes into: named (an empty name would silently mean none)."""
    if not s.strip():
        raise argparse.ArgumentTypeError("is empty, which would mean no weight files (dummy "
                                         "weights). Fix: pass a directory path, or leave the "
                                         "option out")
    return s


def _runner(args: argparse.Namespace, plan: Plan) -> Runner:
    for flag, raw in (("--out", args.out), ("--work", args.work)):
        path = Path(raw)
        if not raw.strip():
            raise ProofError(f"{flag} is empty. Fix: pass a directory path")
        if path.is_symlink():
            raise ProofError(f"{flag} {path} is a symbolic link. Fix: pass the directory itself")
        if path.exists() and not path.is_dir():
            raise ProofError(f"{flag} {path} is a file. Fix: pass a directory path")
    return Runner(plan=plan, out=Path(args.out), work=Path(args.work),
                  model_dir=Path(args.model_dir), python=args.python)


def _start(args: argparse.Namespace, plan: Plan) -> int:
    """0 only when every step asked for ran: a plan goes on past a failed step (the others are
    still worth their minutes on the GPU), and its exit says which failed."""
    try:
        runner = _runner(args, plan)
        runner.run()
    except ProofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = [s.name() for s in plan.steps if s.name() in runner.results.get("failed", {})]
    if failed:
        print(f"error: step(s) {', '.join(failed)} failed: each one's reason is printed above "
              f"and kept in {runner.out / 'proof.json'} under \"failed\"", file=sys.stderr)
        return 1
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        plan = (layout_plan(args.tier) if args.layouts else standard_plan(
            args.tier, args.acceptance_lengths, tuple(args.concurrency),
            tuple(args.short_concurrency)))
    except ProofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    plan.min_prompts, plan.prompts_per_concurrency = args.min_prompts, args.prompts_per_concurrency
    text = plan.to_json()
    if args.write:
        try:
            Path(args.write).write_text(text)
        except OSError as exc:
            print(f"error: --write {args.write}: {exc.strerror or exc}. Fix: name a file you can "
                  "write", file=sys.stderr)
            return 1
        print(f"plan: {len(plan.steps)} steps -> {args.write}")
    else:
        print(text, end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    try:
        plan = Plan.from_json(read_text(Path(args.plan), "--plan", 2**20))
    except (InputError, json.JSONDecodeError, ProofError, TypeError, ValueError) as exc:
        print(f"error: --plan {args.plan}: {exc}. Fix: write one with `inference-lab proof plan "
              "--write FILE`", file=sys.stderr)
        return 1
    if args.steps:
        want = set(args.steps.split(","))
        unknown = want - {s.name() for s in plan.steps}
        if unknown:
            print(f"error: --steps {','.join(sorted(unknown))}: not in {args.plan} (have: "
                  f"{', '.join(s.name() for s in plan.steps)})", file=sys.stderr)
            return 1
        plan.steps = [s for s in plan.steps if s.name() in want]
    return _start(args, plan)


def cmd_step(args: argparse.Namespace) -> int:
    if args.acceptance_length is not None and args.acceptance_rates:
        print("error: give --acceptance-length or --acceptance-rates, not both", file=sys.stderr)
        return 2
    published = args.acceptance_rates == "published"
    step = Step(kind=args.kind, label=args.label or "", sets=tuple(args.set),
                scenarios=tuple(args.scenario),
                acceptance_length=args.acceptance_length, published_acceptance=published,
                acceptance_rates=() if published or not args.acceptance_rates else tuple(
                    _rates(args.acceptance_rates)),
                concurrency=tuple(args.step_concurrency or ()),
                prompt_tokens=args.first_token_prompt,
                first_token_prefix=args.first_token_prefix, fp8_scales=args.fp8_scales or "",
                client_cpus=tuple(args.client_cpus or ()), fp8_table=args.fp8_table or "",
                sampling=args.sampling, starts=tuple(args.starts or ()), vanilla=args.vanilla,
                image_paths=args.image_paths, bundle=args.bundle or "",
                import_profile=args.import_profile, record_triton=args.record_triton,
                weight_files=args.weight_files or "")
    if why := step_problem(step):
        print(f"error: --{why.replace('_', '-')}", file=sys.stderr)
        return 2
    if args.gpus and step.kind != "vanilla":
        print("error: --gpus: only the vanilla step takes a share of the tier's GPUs (a profile "
              "step serves the render's first instance on its own GPUs); drop it",
              file=sys.stderr)
        return 2
    if step.kind == "vanilla" or (step.kind == "ready" and step.vanilla):
        # the plan's rule (vanilla_step), on --gpus of the tier's GPUs where given
        try:
            std = vanilla_step(resolve(args.tier), args.gpus or 0)
        except ProofError as exc:
            print(f"error: --{exc}", file=sys.stderr)
            return 2
        step = replace(step, args=std.args, label=step.label or std.label)
    plan = Plan(tier=args.tier, concurrency=tuple(args.concurrency), steps=[step],
                min_prompts=args.min_prompts, prompts_per_concurrency=args.prompts_per_concurrency)
    return _start(args, plan)


MEASURED = ("runs", "trace", "tune", "gemm", "attention", "ready")  # what a machine's proof.json may hold


def record(run: int, date: str, note: str, machines: list[str],
           tier: str = "h100", title: str = "") -> dict[str, Any]:
    """One run's raw record for docs/benchmarks, of the ledger's schema: each machine's
    proof.json under its name, as `NAME=PATH` or `NAME@TIER=PATH`. A run spans machines when the
    GPU machine is handed back between calls (a fresh one starts bare), and rows of two machines
    are never one table: each keeps its own. Each machine's tier is the one its proof.json names,
    else the one given after @, else `tier`; the record lists them under `tiers`."""
    docs: dict[str, Any] = {}
    tiers: dict[str, str] = {}
    for spec in machines:
        key, sep, path = spec.partition("=")
        name, at, given = key.partition("@")
        if not sep or not name or not path or (at and not given):
            raise ProofError(f"--machine {spec!r}: want NAME=PATH or NAME@TIER=PATH, e.g. "
                             "a=/work/.device/2/proof.json")
        if name in docs:
            raise ProofError(f"--machine {name}: named twice; give each machine its own name")
        try:
            doc = read_json(Path(path), "proof.json", 256 * 2**20)
        except InputError as exc:
            raise ProofError(f"--machine {name}={path}: {exc.why}. Fix: {exc.fix}") from None
        except (ValueError, RecursionError) as exc:
            raise ProofError(f"--machine {name}={path}: not a proof.json ({exc})") from None
        runs = doc.get("runs") if isinstance(doc, dict) else None
        if runs is not None and not (isinstance(runs, dict) and all(
                isinstance(k, str) and isinstance(v, list) and all(isinstance(r, dict) for r in v)
                for k, v in runs.items())):
            raise ProofError(f"--machine {name}={path}: its runs are not rows by configuration "
                             "({\"CONFIG\": [ROW, ...]}): not what a proof step writes")
        # a machine may hold traces or a tune only: measured all the same
        if not isinstance(doc, dict) or not any(doc.get(k) for k in MEASURED):
            raise ProofError(f"--machine {name}={path}: no bench rows, ready times, trace, tune, GEMM or "
                             "attention timings: not what a proof step writes, or every step of it failed")
        own = doc.get("tier")
        if own and given and own != given:
            raise ProofError(f"--machine {spec}: its proof.json holds tier {own}'s steps. "
                             f"Fix: write {name}={path} (or {name}@{own}={path})")
        docs[name], tiers[name] = doc, own or given or tier
    if not docs:
        raise ProofError("no --machine given: name each machine's proof.json as NAME=PATH")
    return {"schema": 1, "kind": "proof", "run": run, "date": date, "title": title, "note": note,
            "tiers": tiers, "machines": docs}


def cmd_record(args: argparse.Namespace) -> int:
    out = Path(args.write or f"docs/benchmarks/{args.date}-proof-run{args.run}.json")
    try:
        if not args.note.strip():
            raise ProofError("--note is empty: say which machines, renders and steps the run holds")
        if not args.title.strip():
            raise ProofError("--title is empty: say in one line what the run measured")
        doc = record(args.run, args.date, args.note, args.machine, args.tier, args.title)
        if out.exists() and not args.force:
            raise ProofError(f"{out} exists: a run's raw record is not rewritten silently; "
                             "give another --run, or --force")
        renders = {t: resolve(t) for t in sorted(set(doc["tiers"].values()))}
    except (ProofError, ProfileErrors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as exc:
        print(f"error: {out}: {exc.strerror or exc}. Fix: name a file you can write with --write",
              file=sys.stderr)
        return 1
    for name, res in doc["machines"].items():
        tier = doc["tiers"][name]
        print(f"== machine {name} ({tier})\n{assemble(res, renders[tier])}")
        if res.get("trace"):
            print(f"traces: {', '.join(res['trace'])}")
    print(f"run {args.run}: {len(doc['machines'])} machine(s) -> {out}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", default="h100")
    p.add_argument("--concurrency", type=bench._ints, default=list(CHAT_CONCURRENCY),
                   help="chat concurrencies (default 1-64)")
    p.add_argument("--out", default=os.environ.get("OUT", "build/proof"),
                   help="results (proof.json); default $OUT")
    p.add_argument("--work", default="/tmp/proof", help="renders, logs, compile caches")
    p.add_argument("--model-dir", default=os.environ.get("MODEL_DIR", "/tmp/model"),
                   help="the weightless target folder (config + tokenizer)")
    p.add_argument("--python", default=sys.executable, help="the Python vLLM runs in")


def _prompts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts-per-concurrency", type=int, default=4,
                   help="bench prompts per unit of concurrency (2 for 70B: ~10 s an answer)")
    p.add_argument("--min-prompts", type=int, default=16,
                   help="at least this many prompts a row")


def _plan_parser(psub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = psub.add_parser("plan", help="write the standard plan (vanilla, draft-off, as imaged at "
                        "each acceptance length)")
    _common(p)
    _prompts(p)
    p.add_argument("--acceptance-lengths", type=_floats, default=None,
                   help="mean lengths measured beside the draft's published acceptance "
                   "(default: 1.0 and k+1, the worst and best a k-token draft can do)")
    p.add_argument("--short-concurrency", type=bench._ints, default=[1, 4, 16, 64],
                   help="concurrencies of every acceptance length after the first")
    p.add_argument("--layouts", action="store_true",
                   help="instead: every split of the tier's GPUs into instances x TP that fits, "
                   "each served whole, and the one to ship chosen (`choose`)")
    p.add_argument("--write", metavar="FILE")
    p.set_defaults(func=cmd_plan)


def _record_parser(psub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = psub.add_parser("record", help="write a run's raw record for docs/benchmarks from "
                        "each machine's proof.json, and print each machine's table")
    p.add_argument("--tier", default="h100",
                   help="the tier of a machine whose proof.json names none (older records)")
    p.add_argument("--run", type=int, required=True, help="the run's number in docs/benchmarks.md")
    p.add_argument("--title", required=True, help="one line: what the run measured")
    p.add_argument("--date", type=_date, default=time.strftime("%Y-%m-%d"),
                   help="YYYY-MM-DD (it names the record's file)")
    p.add_argument("--note", required=True,
                   help="what the run holds: machines, renders, steps, what went wrong")
    p.add_argument("--machine", action="append", default=[], metavar="NAME[@TIER]=PATH",
                   help="a machine's proof.json, repeatable (one per machine the run used); "
                   "@TIER where the file names no tier and it is not --tier")
    p.add_argument("--write", metavar="FILE",
                   help="default docs/benchmarks/DATE-proof-runN.json")
    p.add_argument("--force", action="store_true", help="rewrite an existing record")
    p.set_defaults(func=cmd_record)


def _run_parser(psub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = psub.add_parser("run", help="run a plan file, step by step")
    _common(p)
    p.add_argument("--plan", required=True)
    p.add_argument("--steps", help="run only these steps of the plan (names, comma-separated): "
                   "a plan longer than one call of the GPU machine runs in slices, each adding "
                   "to --out/proof.json")
    p.set_defaults(func=cmd_run)


def _step_arguments(p: argparse.ArgumentParser) -> None:
    """What one step takes beyond the common arguments: its kind, label and settings, the
    acceptance it serves at, and how its clients and tables are placed."""
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--label")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--acceptance-length", type=float)
    p.add_argument("--acceptance-rates", type=_rates_arg, metavar="published|R1,R2,...",
                   help="per-position acceptance: the draft's published figures (catalog) or "
                   "shares, one per draft token")
    p.add_argument("--step-concurrency", type=bench._ints)
    p.add_argument("--gpus", type=int, metavar="N",
                   help="vanilla: tensor parallel over N GPUs of the tier's kind, not the tier's "
                   "count (one instance's share of a multi-GPU tier; or more than the tier has, "
                   "as a plain layout needs: 70B bf16 on two H200s)")
    p.add_argument("--first-token-prompt", type=int, default=0, metavar="N",
                   help="the first token of N-token prompts: timed idle and right after an "
                   "answer (vanilla, profile), or traced instead of decode (trace; with "
                   "--step-concurrency C, sent while C other streams decode)")
    p.add_argument("--first-token-prefix", type=int, default=0, metavar="P",
                   help="with --first-token-prompt N: every one of those prompts begins with the "
                   "same P tokens, cached first, so each first token reads a prefix-cache hit "
                   "(bench's shared-prefix scenario after its first request)")
    p.add_argument("--client-cpus", type=_cpus, metavar="CPUS",
                   help="vanilla, profile, trace: the clients on these CPUs (14,15 or 12-15), the "
                   "server on the others, as clients on other machines would be")
    p.add_argument("--fp8-table", choices=list(FP8_TABLES),
                   help="serve the FP8 GEMM table `tune` measured on this GPU (under --out) "
                   "instead of the one the image ships (steps that serve the profile)")
    p.add_argument("--sampling", choices=list(SAMPLING_SOURCES), default="checkpoint",
                   help="how the bench rows sample: checkpoint (default), the target's "
                   "generation_config, as the image serves a request that sets none; vllm, "
                   "vLLM's own defaults (no top-p), as the older records' rows")
    p.add_argument("--fp8-scales", choices=list(FP8_STANDIN),
                   help="serve the target's FP8 stand-in scaled this way instead of as the "
                   "catalog's checkpoint (profile, trace: price a checkpoint of that kind)")
    p.add_argument("--scenario", action="append", default=[], type=_scenario,
                   help=f"bench scenario, repeatable (default chat): {', '.join(bench.SCENARIOS)}; "
                   "NAME:C1,C2 runs it at its own concurrencies instead of --step-concurrency's")
    p.add_argument("--starts", type=_starts, metavar=",".join(READY_STARTS),
                   help="ready: the starts to time, in order (default cold,warm,bundle); readahead "
                   "starts from the bundle after reading ahead what a start reads; "
                   "checkpoint restores the start before it from a CRIU checkpoint taken once "
                   "it answered, the page cache dropped first (root, CRIU: $PROOF_CRIU or on "
                   "PATH); restart restores it with the images left in the page cache")
    p.add_argument("--vanilla", action="store_true",
                   help="ready: time vanilla `vllm serve` instead of the render")
    p.add_argument("--image-paths", action="store_true",
                   help="ready: serve from the image's own paths (vLLM venv, models, caches), "
                   "so that the bundle it packs loads on an image")
    p.add_argument("--bundle", metavar="FILE",
                   help="ready: the bundle start restores this warm-cache bundle (made on "
                   "another machine) instead of packing this one's cache")
    p.add_argument("--import-profile", action="store_true",
                   help="ready: also time `import` of vLLM's API server (python -X importtime)")
    p.add_argument("--record-triton", action="store_true",
                   help="ready: record the Triton kernels the render's first start compiles as "
                   "the tier's list (kernels-<tier>.json) for the build's precompile")
    p.add_argument("--weight-files", metavar="DIR", type=_folder_arg,
                   help="the render's models get stand-in weight files of their real names and "
                   "shapes under DIR (a tmpfs that holds the models' weights), read instead of "
                   "dummy weights: what a checkpoint that reads its weights again from the "
                   "model's files needs (serving.checkpoint_weights: files)")


def _step_parser(psub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = psub.add_parser("step", help="run one step, e.g. a variant: step profile --label x "
                        "--set serving.max_num_seqs=64")
    _common(p)
    _prompts(p)
    _step_arguments(p)
    p.set_defaults(func=cmd_step)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    pp = sub.add_parser("proof", help="the GPU proof: vanilla vLLM against the profile as imaged "
                        "(run on the GPU machine)")
    psub = pp.add_subparsers(dest="proof_cmd", required=True, metavar="ACTION")
    for part in (_plan_parser, _record_parser, _run_parser, _step_parser):
        part(psub)

