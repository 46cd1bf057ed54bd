"""The Triton kernels a tier's start compiles: recorded once on a GPU, compiled again by the image's
build on its CPU builder into the Triton cache every start of the image reads.

vLLM 0.26 compiles its Triton kernels (the sampler's top-k/top-p, the V2 model runner's input and
sampling kernels, the plugin's attention and GEMV) at their first launch, one after another, most
of them in the warm-up before the server answers. Triton keys a compiled kernel by its source,
its specialization (argument types, alignments, constants, launch options), the target
architecture and its own version: not by the GPU, and it needs none to compile. So what a start on
one GPU of an architecture compiled, a CPU builder can compile for every GPU of it, given the
specializations: `record` writes them as Triton hands them to its jit_cache_hook (the form its own
`JITFunction.preload` reads), and `precompile` compiles a tier's list (kernels/<tier>.json) into
TRITON_CACHE_DIR. A start then finds each kernel in the cache; one whose key differs (another
vLLM, another architecture) is compiled at its launch, as before.

`python -m inference_image_vllm.triton_kernels precompile` is what `inference-startup precompile`
runs at the build, with the unit's environment (INFERENCE_IMAGE_TRITON_KERNELS names the tier)
and vLLM's Python.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import switches

KERNELS = Path(__file__).with_name("kernels")
SCHEMA = 1


# a tier's name as the render writes it: the list is kernels/<tier>.json and nothing else
TIER = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}\Z")
MAX_LIST = 64 * 2**20
MAX_DEPTH = 32


def list_path(tier: str) -> Path:
    """kernels/<tier>.json; ValueError for a name that is not a tier's (a path, '..')."""
    if not TIER.match(tier) or ".." in tier:
        raise ValueError(f"{tier[:80]!r} is not a tier's name")
    return KERNELS / f"{tier}.json"


def _depth(doc: Any, limit: int) -> None:
    stack = [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if d > limit:
            raise ValueError(f"nested deeper than {limit} levels")
        if isinstance(node, dict):
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, d + 1) for v in node]


# ---- recording (the lab, on a GPU) ------------------------------------------------------------

def entry(module: str, name: str, specialization_data: str) -> dict[str, Any]:
    """One compile as the list keeps it: where the kernel is defined, and Triton's own
    serialization of its specialization."""
    return {"module": module, "name": name, "spec": json.loads(specialization_data)}


def recorder(path: Path, chained: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A Triton jit_cache_hook that appends each compile to `path` (JSON lines), then asks the hook
    that was installed before it. It never skips a compile (a true answer would)."""

    def hook(*, key: Any, repr: str, fn: Any, compile: dict[str, Any], is_manual_warmup: bool,
             already_compiled: bool) -> Any:
        data = compile.get("specialization_data")
        module = getattr(fn, "module", "")
        if data and module and not str(module).startswith("torch._inductor"):
            line = json.dumps(entry(str(module), str(fn.name), data), sort_keys=True) + "\n"
            with path.open("a") as f:  # one short write a compile: whole lines from any process
                f.write(line)
        if chained is not None:
            return chained(key=key, repr=repr, fn=fn, compile=compile,
                           is_manual_warmup=is_manual_warmup, already_compiled=already_compiled)
        return None

    return hook


def install_recorder(path: Path) -> None:
    from triton import knobs

    knobs.runtime.jit_cache_hook = recorder(path, knobs.runtime.jit_cache_hook)


def collect(lines: list[str]) -> list[dict[str, Any]]:
    """The recorded compiles, each specialization once, in the order they were first compiled."""
    seen: set[str] = set()
    out = []
    for line in lines:
        if not line.strip():
            continue
        e = json.loads(line)
        k = json.dumps([e["module"], e["name"], e["spec"]], sort_keys=True)
        if k not in seen:
            seen.add(k)
            out.append(e)
    return out


# ---- precompiling (the build, on its CPU builder) ---------------------------------------------

def kernel_function(module: str, name: str) -> Any:
    """The JITFunction a recorded compile was of: the module's attribute, unwrapped from Triton's
    autotuner and heuristics."""
    from triton.runtime.jit import JITFunction

    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{module}.{name} is not a Triton kernel")
    return obj


def source(fn: Any, spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Triton's ASTSource and options of a recorded specialization, read as Triton's
    JITFunction.preload reads it."""
    import triton.language as tl
    from triton.compiler import ASTSource
    from triton.runtime.jit import convert_to_tuple_if_list

    if spec.get("name") != f"{fn.__module__}.{fn.__qualname__}":
        raise ValueError(f"recorded for {spec.get('name')}, found {fn.__module__}."
                         f"{fn.__qualname__}")
    constexprs = {
        tuple(k): tl.dtype(v) if tl.dtype.is_dtype(v) else
        tl.constexpr(v["constexpr"]) if isinstance(v, dict) and "constexpr" in v else v
        for k, v in zip(spec["constant_keys"], spec["constant_vals"], strict=True)}
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"], strict=True)}
    signature = {k: convert_to_tuple_if_list(v) for k, v in spec["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    # the recording machine's libdevice path: the image's own is filled in (keyed by content)
    options.pop("extern_libs", None)
    return ASTSource(fn, signature, constexprs, attrs), options


# an entry -> whether its kernel was compiled now (not found cached), and why its launcher was
# not built ("" where it was)
CompileOne = Callable[[dict[str, Any]], tuple[bool, str]]


def precompile(doc: dict[str, Any], compile_one: CompileOne | None = None) -> str:
    """Compile every kernel of a recorded list, and the launcher Triton builds for it with the
    system's C compiler at its first launch, into TRITON_CACHE_DIR; one line saying what was
    done. `compile_one` stands in for Triton's compiler in tests."""
    t0 = time.monotonic()
    kernels = doc.get("kernels") or []
    if compile_one is None:
        compile_one = _compiler(str(doc.get("capability", "")))
    compiled = cached = 0
    skipped: list[str] = []
    no_launcher: list[str] = []
    for e in kernels:
        try:
            now, launcher = compile_one(e)
        except Exception as exc:  # a kernel vLLM renamed or changed: its start compiles it
            skipped.append(f"{e.get('module')}.{e.get('name')}: {type(exc).__name__}: {exc}"[:200])
            continue
        compiled, cached = compiled + now, cached + (not now)
        if launcher:
            no_launcher.append(launcher[:200])
    line = (f"{compiled} compiled, {cached} already cached, {len(skipped)} skipped of "
            f"{len(kernels)} recorded for compute capability {doc.get('capability')}, "
            f"{compiled + cached - len(no_launcher)} launchers built, in "
            f"{time.monotonic() - t0:.0f} s")
    if skipped:
        line += f" (first skipped: {skipped[0]})"
    if no_launcher:
        line += f" (first launcher not built: {no_launcher[0]})"
    return line


def _compiler(capability: str) -> CompileOne:
    import triton
    from triton.backends.compiler import GPUTarget

    major, _, minor = capability.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"the list names no compute capability ({capability!r})")
    target = GPUTarget("cuda", int(major) * 10 + int(minor), 32)
    cache = Path(os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")).expanduser()

    def compile_one(e: dict[str, Any]) -> tuple[bool, str]:
        src, options = source(kernel_function(e["module"], e["name"]), e["spec"])
        # Triton's metadata file of this kernel, one a specialization (compiler.compile names it)
        entries = f"*/{src.name[:150]}.json"
        before = sum(1 for _ in cache.glob(entries))
        kernel = triton.compile(src, target=target, options=options)
        now = sum(1 for _ in cache.glob(entries)) > before
        try:
            # what CompiledKernel builds at its first launch: a C module keyed by its source (the
            # signature and constants) and the platform, linked against the driver's libcuda
            from triton.backends.nvidia.driver import CudaLauncher

            CudaLauncher(src, kernel.metadata)
        except Exception as exc:  # no libcuda or no C compiler here: the start builds it
            return now, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        return now, ""

    return compile_one


def load(tier: str) -> dict[str, Any] | None:
    path = list_path(tier)
    if not path.is_file():
        return None
    return load_path(path)


def load_path(path: Path) -> dict[str, Any]:
    """A recorded list read and checked: ValueError in one line naming the file and what is
    wrong (too large, nested too deeply, another schema, a capability that is not a text like
    "9.0", kernels that are not a list of {module, name, spec})."""
    if path.stat().st_size > MAX_LIST:
        raise ValueError(f"{path}: larger than {MAX_LIST // 2**20} MiB")
    try:
        # Triton's float constexprs (a mask's -inf) are written as json.dumps writes them
        doc = json.loads(path.read_text())
    except RecursionError:
        raise ValueError(f"{path}: nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    _depth(doc, MAX_DEPTH)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    # every field that is not what the recorder writes, said at once
    wrong = []
    if doc.get("schema") != SCHEMA:
        wrong.append(f"schema {doc.get('schema')!r}, this plugin reads {SCHEMA}")
    cap = doc.get("capability")
    if not isinstance(cap, str) or not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", cap):
        wrong.append(f"capability is {cap!r} ({type(cap).__name__}), not a compute capability "
                     "written as text (e.g. \"9.0\")")
    kernels = doc.get("kernels")
    if not isinstance(kernels, list) or not all(
            isinstance(e, dict) and isinstance(e.get("module"), str) and
            isinstance(e.get("name"), str) and isinstance(e.get("spec"), dict) for e in kernels):
        wrong.append("kernels is not a list of {module, name, spec} entries")
    if wrong:
        raise ValueError(f"{path}: " + "; ".join(wrong))
    return doc


def stale(doc: dict[str, Any]) -> str:
    """Why a list's kernels cannot match this install's keys (another vLLM or Triton), or ""."""
    from importlib.metadata import version

    for pkg in ("vllm", "triton"):
        have = version(pkg)
        if doc.get(pkg) and doc[pkg] != have:
            return f"recorded with {pkg} {doc[pkg]}, this is {have}"
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference_image_vllm.triton_kernels")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("precompile", help="compile the recorded kernels of the tier the unit's "
                   "environment names (serving.triton_precompile) into TRITON_CACHE_DIR")
    c = sub.add_parser("collect", help="a recording's JSON lines as a tier's list")
    c.add_argument("recording", type=Path)
    for name in ("tier", "capability", "device", "profile-sha256"):
        c.add_argument(f"--{name}", required=True)
    args = p.parse_args(argv)
    if args.cmd == "collect":
        from importlib.metadata import version

        doc = {"schema": SCHEMA, "tier": args.tier, "capability": args.capability,
               "recorded_on": args.device, "profile_sha256": args.profile_sha256,
               "vllm": version("vllm"), "triton": version("triton"),
               "kernels": collect(args.recording.read_text().splitlines())}
        print(json.dumps(doc, indent=1, sort_keys=True))
        return 0
    tier = os.environ.get(switches.TRITON_KERNELS, "")
    if not tier:
        print("triton kernels: none to precompile (serving.triton_precompile is off)")
        return 0
    try:
        doc = load(tier)
    except (ValueError, OSError) as exc:
        print(f"triton kernels of {tier}: unreadable list ({exc}); nothing precompiled")
        return 1
    if doc is None:
        print(f"triton kernels of {tier}: no recorded list ({list_path(tier)}); nothing "
              "precompiled")
        return 1
    why = stale(doc)
    if why:
        print(f"triton kernels of {tier}: {why}; nothing precompiled (each start compiles its "
              "own)")
        return 0
    print(f"triton kernels of {tier}: {precompile(doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
