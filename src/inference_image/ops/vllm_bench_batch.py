"""Run several `vllm bench serve` invocations in one Python process.

Run BY vLLM's Python, as a file (`PYTHON vllm_bench_batch.py PLAN.json`): it imports only the
standard library and vLLM, so it works in a venv that lacks this package. A `vllm bench serve`
process per concurrency pays vLLM's import each time, longer than many rows' load. Importing
once leaves vLLM's own test and warm-up requests per run.

PLAN.json: a list of argument lists, each what follows `vllm bench serve` on its command line.
For every entry it prints one line `@@bench {"i": N, "rc": 0|1, "error": "..."}` on stdout after
the run, and stops at the first failure (as the per-process path does). Before each entry after
the first it waits for a line on stdin (GO): the harness reads the server's counters between two
entries, and the next entry's requests must not reach the server before it has.
"""

from __future__ import annotations

import json
import sys
import traceback

MARK = "@@bench "
GO = "go\n"


def main(plan_path: str) -> int:
    try:
        from vllm.benchmarks.serve import add_cli_args
        from vllm.benchmarks.serve import main as bench_main
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        print(MARK + json.dumps({"i": 0, "rc": 1, "error": (
            f"{sys.executable} cannot import vLLM's benchmark ({exc}). Fix: pass the Python of "
            "the venv vLLM is installed in, e.g. /opt/vllm/bin/python")}), flush=True)
        return 1

    with open(plan_path) as fh:
        plan = json.load(fh)
    for i, argv in enumerate(plan):
        if i and sys.stdin.readline() != GO:  # the harness is gone: run nothing more
            return 1
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        try:
            bench_main(parser.parse_args(argv))
        except (Exception, SystemExit) as exc:  # argparse exits; the harness needs a line either way
            traceback.print_exc()
            print(MARK + json.dumps({"i": i, "rc": 1, "error": f"{type(exc).__name__}: {exc}"}),
                  flush=True)
            return 1
        print(MARK + json.dumps({"i": i, "rc": 0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
