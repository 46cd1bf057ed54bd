"""What a vLLM instance's start costs, and the warm-cache bundle that carries what a start
compiles onto a new machine.

The machine's runtime (its own wheel, stdlib only): the image installs it into a virtualenv of
the system's Python (/opt/inference-machine) with its console scripts, inference-run,
inference-join, inference-firstboot, inference-acme and inference-startup; the build host and
the lab import it for the bundle's key and format. What it needs to know of the instance's vLLM
environment it asks that environment's Python (INFERENCE_PYTHON) with a file of its own
(site_probe.py, inspect_in_vllm.py).

A bundle is a tar.gz of the instance caches (vLLM's compile cache and startup plan, inductor,
Triton, the XDG cache) with a manifest, keyed by everything that makes its contents wrong for a
machine: the vLLM, torch, Triton and Python versions, where vLLM is installed and where the caches
live (vLLM's compile hash reads source paths), the GPU model and driver branch, the profile's and
the plugin's digests. `check` runs before every start: a bundle whose key is not this machine's,
or whose files are not what its manifest says, is removed with one line saying why, and the start
compiles as on a fresh machine. A check never fails a start.

    inference-startup key --cache DIR [--profile-json F]           this machine's key (JSON)
    inference-startup make --cache DIR --out B.tar.gz [--profile-json F]
    inference-startup show B.tar.gz                                 what a bundle is for
    inference-startup install B.tar.gz --cache DIR [--owner USER]
    inference-startup seal --cache DIR [--profile-json F] [--owner U]  a build's warm cache, keyed here
    inference-startup check --cache DIR [--profile-json F]          one line; exit 0 whatever it finds
    inference-startup prefetch                                      what a start reads, into the page cache
    inference-startup inspect --env E [--args A] [--owner USER]     vLLM's model inspections, cached
    inference-startup ready INSTANCE --endpoint F                   a start's phases, once it serves
    inference-startup status INSTANCE                               what a start is doing now
    inference-startup motd                                          the login banner (from profile.json)
    inference-startup phases [--since-monotonic S] < LOG            a start's phases (JSON)
    inference-startup fleet-role FILE [--mode M] [--nodes N]        a machine's part in a fleet
    inference-startup public-health                       the public port's /health, as clients see it
"""

from __future__ import annotations

from .anatomy import (
    MOMENTS,
    PHASES,
    REPORTED,
    SAID,
    anatomy,
    doing,
    journal_lines,
    ready,
    ready_report,
    record_ready,
    status,
)
from .bundle import (
    CACHE_PARTS,
    KEY_FIELDS,
    MANIFEST,
    REJECTED,
    BundleError,
    check,
    describe,
    install,
    key_differences,
    machine_key,
    make,
    seal,
    vllm_site,
)
from .prepare import (
    READS,
    architectures,
    inspect_models,
    load_reads,
    precompile_kernels,
    prefetch,
    prefetch_roots,
    unit_environ,
)

__all__ = [
    "CACHE_PARTS",
    "KEY_FIELDS",
    "MANIFEST",
    "MOMENTS",
    "PHASES",
    "READS",
    "REJECTED",
    "REPORTED",
    "SAID",
    "BundleError",
    "anatomy",
    "architectures",
    "check",
    "describe",
    "doing",
    "inspect_models",
    "install",
    "journal_lines",
    "key_differences",
    "load_reads",
    "machine_key",
    "make",
    "precompile_kernels",
    "prefetch",
    "prefetch_roots",
    "ready",
    "ready_report",
    "record_ready",
    "seal",
    "status",
    "unit_environ",
    "vllm_site",
]
