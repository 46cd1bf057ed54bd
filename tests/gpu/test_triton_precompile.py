"""The build's precompile of recorded Triton kernels (the plugin's triton_kernels.py) with Triton
itself, which needs no GPU to compile: a specialization as Triton serializes it for its
jit_cache_hook, compiled by `precompile` into an empty TRITON_CACHE_DIR, is what the compile a
start's JIT asks for then finds there. Runs where Triton is installed (the GPU machine: `pytest
tests/gpu`); skipped, with the reason, everywhere else."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="Triton is installed beside vLLM (GPU machine)")
tl = pytest.importorskip("triton.language")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins/vllm"))
from inference_image_vllm import triton_kernels  # noqa: E402

KERNEL = '''
import triton, triton.language as tl

@triton.jit
def scale(X, Y, N, ALPHA: tl.constexpr, BLOCK: tl.constexpr, DT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(X + offs, mask=m).to(DT)
    tl.store(Y + offs, (x * ALPHA).to(tl.float32), mask=m)
'''


def test_a_precompiled_specialization_is_the_one_a_starts_jit_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.runtime.jit import serialize_specialization_data

    (tmp_path / "toy_kernels.py").write_text(KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    fn = importlib.import_module("toy_kernels").scale
    target = GPUTarget("cuda", 90, 32)
    # as JITFunction._pack_args hands a compile to the hook: a float, an int and a dtype constant
    sig = {"X": "*fp32", "Y": "*fp32", "N": "i32", "ALPHA": "constexpr", "BLOCK": "constexpr",
           "DT": "constexpr"}
    constexprs = {(3,): 2.5, (4,): 128, (5,): tl.float16}
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    options = CUDABackend(target).parse_options({"num_warps": 4})
    data = serialize_specialization_data("toy_kernels.scale", sig, constexprs, attrs, options, "k")
    doc = json.loads(json.dumps({"capability": "9.0", "kernels": [
        triton_kernels.entry("toy_kernels", "scale", data)]}))  # through the list's JSON
    first = triton_kernels.precompile(doc)
    assert first.startswith("1 compiled, 0 already cached, 0 skipped"), first
    assert triton_kernels.precompile(doc).startswith("0 compiled, 1 already cached, 0 skipped")
    # the launcher needs the driver's libcuda to link against: built where it is installed
    assert ("1 launchers built" in first) != ("first launcher not built" in first), first
    kernel = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=target,
                            options=options.__dict__)
    assert kernel.metadata.name == "scale"
    entries = list((tmp_path / "cache").glob("*/scale.json"))
    assert len(entries) == 1  # the start's compile added nothing: it was the same key
