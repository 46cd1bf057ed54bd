"""inference-image: the command line. Bad input ends in one line per problem and exit code 1."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from inference_machine import BundleError
from inference_machine.inputs import InputError

from . import __version__
from .memory import decode_bytes_per_token
from .ops import bench, fleet, soak, verify
from .profiles import (
    ProfileError,
    ProfileErrors,
    Resolved,
    default_profiles_dir,
    list_tiers,
    resolve,
)
from .render import RenderError, render
from .schema import field_reference
from .tables import text_table


def _table(rows: list[list[str]]) -> str:
    return text_table(rows, rule=True)


def _pdir(args: argparse.Namespace) -> Path:
    return Path(args.profiles_dir) if args.profiles_dir else default_profiles_dir()


def _fail(errors: Sequence[ProfileError | str]) -> int:
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1


def cmd_profiles(args: argparse.Namespace) -> int:
    if args.fields:
        print(field_reference(), end="")
        return 0
    try:
        list_tiers(_pdir(args))
    except ProfileErrors as exc:
        return _fail(exc.errors)
    if args.names:  # for scripts (the Makefile's validate): one valid tier a line
        errors: list[ProfileError] = []
        for tier in list_tiers(_pdir(args)):
            try:
                resolve(tier, _pdir(args))
                print(tier)
            except ProfileErrors as exc:
                errors += exc.errors
        return _fail(errors) if errors else 0
    # one screen wide: the GPU without its vendor, its count in the droplet size, the draft by
    # its method (the profile says which)
    rows = [["TIER", "GPU", "DO SIZE", "FA3", "FP8", "MODEL", "WEIGHTS", "SPEC", "INSTANCES x TP"]]
    errors: list[ProfileError] = []
    for tier in list_tiers(_pdir(args)):
        try:
            r = resolve(tier, _pdir(args))
        except ProfileErrors as exc:
            errors += exc.errors
            continue
        p = r.profile
        spec = p.model.speculative
        rows.append([
            p.tier, (p.hardware.gpu_model or "(cpu)").removeprefix("NVIDIA "), p.digitalocean.size,
            "yes" if r.fa3_available else "no", "yes" if r.fp8_available else "no",
            p.model.target, p.model.quantization, spec.method,
            f"{p.serving.instances} x {p.serving.tensor_parallel_size}"
            + (f" on {p.serving.nodes} nodes" if p.serving.nodes > 1 else ""),
        ])
    print(_table(rows))
    return _fail(errors) if errors else 0


def _summary(r: Resolved) -> str:
    if r.fit is None:
        return f"cpu, {r.profile.serving.instances} instance(s)"
    f, p = r.fit, r.profile
    # one stream reads every weight a token (a 512-in, 512-out chat's mean context): the
    # datasheet bandwidth over that bounds its decode, before speculation (tensor parallel GPUs
    # read their shares at once; pipeline stages one after the other)
    per_token = decode_bytes_per_token(r.target, p.model.quantization, p.model.kv_cache_dtype,
                                       768) / p.serving.tensor_parallel_size
    bound = p.hardware.memory_bandwidth_tbs * 1e12 / per_token
    return (f"{f.needed_gib:.1f} of {f.available_gib:.1f} GiB per GPU "
            f"(weights {f.weights_gib:.1f}, draft {f.draft_gib:.1f}, KV {f.kv_gib:.1f}); one "
            f"stream decodes at most {bound:,.0f} tok/s before speculation "
            f"({p.hardware.memory_bandwidth_tbs:g} TB/s)")


def cmd_validate(args: argparse.Namespace) -> int:
    pdir = _pdir(args)
    try:
        tiers = list_tiers(pdir) if args.all or not args.tiers else args.tiers
    except ProfileErrors as exc:
        return _fail(exc.errors)
    errors: list[ProfileError] = []
    for tier in tiers:
        try:
            r = resolve(tier, pdir, overrides=args.set)
        except ProfileErrors as exc:
            errors += exc.errors
            continue
        print(f"ok  {tier}: {_summary(r)}")
    return _fail(errors) if errors else 0


def cmd_render(args: argparse.Namespace) -> int:
    if bool(args.tier) == bool(args.profile):
        return _fail(["render: name one tier, as `render h100` or `render --profile h100`. Fix: "
                      "give it once"])
    tier = args.tier or args.profile
    if args.out is not None and not args.out.strip():
        return _fail(["render: --out is empty. Fix: give an output directory, or leave --out out "
                      f"for build/{tier}"])
    try:
        r = resolve(tier, _pdir(args), overrides=args.set)
        out = Path(args.out or f"build/{tier}")
        written = render(r, out)
    except ProfileErrors as exc:
        return _fail(exc.errors)
    except (RenderError, OSError) as exc:
        return _fail([str(exc)])
    print(f"rendered {tier} (profile sha256 {r.digest[:12]}) into {out}: "
          f"{len(written)} files")
    if args.verbose:
        for rel in written:
            print(f"  {rel}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="inference-image",
        description="Build inference-optimized vLLM images per GPU tier.",
    )
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    ap.add_argument("--profiles-dir", help="profile directory (default: the project's profiles/)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sp = sub.add_parser("profiles", help="table of GPU tiers")
    sp.add_argument("--names", action="store_true", help="only the tier names, one a line")
    sp.add_argument("--fields", action="store_true", help="every profile field as a Markdown "
                    "table (docs/reference.md's profile reference)")
    sp.set_defaults(func=cmd_profiles)

    sp = sub.add_parser("validate", help="check profiles (all by default)")
    sp.add_argument("tiers", nargs="*", metavar="TIER")
    sp.add_argument("--all", action="store_true", help="every tier in the profile directory")
    sp.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="try an override, e.g. serving.max_num_seqs=128")
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("render", help="write everything the image needs for one tier")
    sp.add_argument("tier", nargs="?", metavar="TIER", help="the tier, as validate takes it")
    sp.add_argument("--profile", metavar="TIER", help="the same, as a flag (the Makefile's form)")
    sp.add_argument("--out", help="output directory (default: build/TIER)")
    sp.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override one profile field, e.g. model.speculative.method=none")
    sp.add_argument("-v", "--verbose", action="store_true", help="list the files written")
    sp.set_defaults(func=cmd_render)

    for register in EXTRA_COMMANDS:
        register(sub)
    return ap


# Later subcommands (verify, bench) register themselves here to keep this module small.
EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    bench.register, verify.register, soak.register, fleet.register]


# The errors that say what is wrong and the fix in a line (a profile's problems, one a line): a
# command that meets one it did not catch itself ends with it, exit 1, not a traceback.
ONE_LINE_ERRORS: tuple[type[Exception], ...] = (ProfileErrors, InputError, RenderError,
                                                BundleError)


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
        one_line: tuple[type[Exception], ...] = ()) -> int:
    """Parse and run a subcommand: its exit code; 130 on Ctrl-C, 0 when the reader of its output
    went away (`| head`), 1 with one line on an error of ONE_LINE_ERRORS or `one_line`. The lab's
    console script runs its commands the same way."""
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a full disk or a closed reader shows here, not at the exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _drop_stdout()
        return 0
    except (*ONE_LINE_ERRORS, *one_line) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # the output or a file cannot be written (a full disk, /dev/full, a read-only folder):
        # one line, and what is left in the output's buffer dropped, not raised again at exit
        _drop_stdout()
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: cannot write or read{where}: {exc.strerror or exc}. Fix: free space or "
              "write elsewhere", file=sys.stderr)
        return 1


def _drop_stdout() -> None:
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (lives as long as the process)


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
