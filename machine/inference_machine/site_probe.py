"""Run by an instance's vLLM Python as a file: where that interpreter imports vLLM, torch and
Triton from (found, not imported) and its version, as one JSON line. The bundle key is the
vLLM environment's, and the machine's runtime runs with another Python. Stdlib only; it imports
nothing of the package it ships in."""

import importlib.util
import json
import sys


def site_of(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    import os
    return os.path.dirname(os.path.dirname(spec.origin))


if __name__ == "__main__":
    print(json.dumps({"python": f"{sys.version_info[0]}.{sys.version_info[1]}",
                      **{m: site_of(m) for m in ("vllm", "torch", "triton")}}))
