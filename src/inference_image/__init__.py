"""Build inference-optimized GPU images: profiles, render, verify, bench."""

__version__ = "0.1.0"
