"""inference-lab: the GPU proof and its tools (docs/gpu-machine.md). Run where the GPU is."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from inference_image import __version__
from inference_image.cli import run

from . import ledger, proof_cli, spy
from .proof_plan import ProofError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="inference-lab",
                                 description="Measure inference-image's renders on a GPU machine.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    proof_cli.register(sub)
    ledger.register(sub)
    spy.register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv, (ProofError, ledger.LedgerError))


if __name__ == "__main__":
    sys.exit(main())
