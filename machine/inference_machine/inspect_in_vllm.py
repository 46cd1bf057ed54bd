"""Run by an instance's vLLM Python as a file (`inference-startup inspect` at build): vLLM
inspects each architecture the unit serves, as a start would, and keeps what it learnt in its
cache; then what the start reads is recorded. Stdlib and vLLM only: it imports nothing of the
package it ships in, whose Python is another.

    python inspect_in_vllm.py ARCH...         one line an architecture, then the READS line
    python inspect_in_vllm.py --names MOD...  the READS line of importing MOD... (no vLLM)

The READS line: `READS {"libs": [...], "modules": [...]}` (or `READS-FAILED why`)."""

import contextlib
import importlib
import json
import os
import sys
import time

# the modules a start imports besides what the inspection does: the API server, and what the
# engine core imports after its fork (the models' own modules are added by architecture)
READS_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.v1.engine.core",
                 "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu.model_runner",
                 "vllm.v1.attention.backends.flash_attn", "inference_image_vllm")


def record(names: list[str]) -> dict[str, list[str]]:
    """Import `names` (one missing is skipped), then every module file Python has loaded and
    every shared library this process maps, each once, in the order they came."""
    for name in names:
        if name:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    seen: set[str] = set()
    modules: list[str] = []
    libs: list[str] = []

    def add(path: str, into: list[str]) -> None:
        real = os.path.realpath(path)
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            into.append(real)

    for m in list(sys.modules.values()):
        # the module's own attributes only: a lazy module (transformers') imports what an
        # attribute it lacks names, and that import may fail
        d = getattr(m, "__dict__", None) or {}
        cached, file = d.get("__cached__"), d.get("__file__")
        for f in (cached, file) if isinstance(file, str) and file.endswith(".py") else (file,):
            if isinstance(f, str) and os.path.isfile(f):
                add(f, modules)
                break
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and ".so" in parts[5]:
                add(parts[5].strip(), libs)
    return {"libs": libs, "modules": modules}


def say_reads(names: list[str]) -> None:
    try:
        print("READS " + json.dumps(record(names)), flush=True)
    except Exception as exc:  # the inspection stands without the record
        print(f"READS-FAILED {type(exc).__name__}: {exc}", flush=True)


def inspect(archs: list[str]) -> None:
    from vllm.model_executor.models.registry import ModelRegistry
    for arch in archs:
        t0 = time.monotonic()
        info = ModelRegistry._try_inspect_model_cls(arch)
        print(arch, "inspected" if info else "unknown", round(time.monotonic() - t0, 1),
              flush=True)
    say_reads([*READS_MODULES, *(getattr(ModelRegistry.models.get(a), "module_name", None) or ""
                                 for a in archs)])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--names"]:
        say_reads(sys.argv[2:])
    else:
        inspect(sys.argv[1:])
