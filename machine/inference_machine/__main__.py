"""`python -m inference_machine`: inference-startup."""

import sys

from .cli import main

sys.exit(main())
