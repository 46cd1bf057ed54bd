#!/usr/bin/env python3
"""inference-startup: what a vLLM instance's start costs, and the warm-cache bundle that carries
what a start compiles onto a new machine (`inference-startup --help`).

On the image this file is /usr/local/sbin/inference-startup and its package lies under
/usr/local/lib/inference-image (a render directory mirrors both); in the source tree it is
inside the package. Stdlib only."""

import sys
from pathlib import Path

sys.dont_write_bytecode = True  # nothing written beside the image's files
_here = Path(__file__).resolve()
_lib = _here.parents[1] / "lib" / "inference-image"
sys.path.insert(0, str(_lib if (_lib / "inference_image").is_dir() else _here.parents[2]))

from inference_image.startup.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
