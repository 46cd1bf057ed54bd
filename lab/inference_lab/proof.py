"""inference-lab proof: the GPU proof as named, typed steps, run on the GPU machine.

Every speed claim of the project is made here, about the image as it serves: a `profile` step
renders the tier (`render`, the same files the image gets), starts its instance with the
rendered `inference-run vllm-0` (what systemd runs), and benchmarks it with `bench`. The only
change a step may make to the rendered command line is a synthetic draft acceptance length
(`--acceptance-length`), because random weights would reject every draft token; the step
records that it did.

A plan is a JSON list of steps: `proof plan` writes the standard one, `proof run --plan FILE`
replays it, `proof step KIND ...` runs one (`--set` for a variant). Results go under --out as
the JSON docs/benchmarks/ keeps (one document, written by the `assemble` step).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_image.ops import bench
from inference_image.ops.bench import acceptance, engine_counters
from inference_image.ops.cause import failure_cause
from inference_image.profiles import (
    ProfileErrors,
    Resolved,
    project_root,
    resolve,
)
from inference_image.render import NATIVE_SAMPLER, render
from inference_image.schema import scenario_spec
from inference_machine.contract import ENV, cache_env

from . import nodes, standin_weights
from .proof_machine import (
    BESIDE_TOKENS,
    CUT_LOG_LINES,
    NO_CUDA_HOME,
    SERVED_SEED,
    SETTLE_CONCURRENCY,
    SETTLE_SEED,
    Server,
    backends,
    compiled_into,
    dry_run,
    router_bin,
    runtime,
    serving,
    start,
    without_cuda_compiler,
)
from .proof_plan import (
    CHAT_CONCURRENCY,
    DRAFTS,
    FP8_STANDIN,
    FP8_TABLE_ENV,
    HOST_ONLY,
    KINDS,
    NO_DRAFT,
    STANDIN,
    TARGETS,
    TUNED_TABLE,
    Plan,
    ProofError,
    Step,
    choose_layout,
    layout_candidates,
    layout_plan,
    mean_length,
    published_acceptance,
    published_length_range,
    published_rates,
    standard_plan,
    step_problem,
    vanilla_step,
)
from .proof_probes import (
    PLUGIN_MARK,
    SAMPLINGS,
    decode_streams,
    first_token_probes,
    first_tokens,
    greedy,
    make_models,
    parse_engine_steps,
    plugin_digest,
    sampling_checks,
    shared_prefix,
    sum_rows,
    tune_models,
    with_acceptance,
)
from .proof_ready import ReadySteps
from .proof_report import acceptance_needed, assemble, attention_lines
from .proof_tools import ToolSteps


@dataclass
class Runner(ToolSteps, ReadySteps):
    plan: Plan
    out: Path
    work: Path
    model_dir: Path
    python: str = sys.executable
    results: dict[str, Any] = field(default_factory=dict)
    # what the step in flight is doing, and the server log it writes: a step cut off by a time
    # limit says where it was, with the end of that log
    phase: tuple[str, float] = ("", 0.0)
    log: Path | None = None
    # the phase when the signal came: a step's `finally` (stopping its server) moves the phase on
    # before the cut is recorded, and the record would say it was stopping its server
    cut_at: tuple[str, float] | None = None
    # the step's server CPUs while its clients are pinned apart (Step.client_cpus)
    server_cpus: frozenset[int] | None = None
    # a render over several nodes (serving.nodes): the nodes besides the head, by step label
    node_runs: dict[str, list[nodes.Node]] = field(default_factory=dict)

    @property
    def doc_path(self) -> Path:
        return self.out / "proof.json"

    def _phase(self, what: str, log: Path | None = None) -> None:
        self.phase = (what, time.monotonic())
        if log is not None:
            self.log = log

    @contextlib.contextmanager
    def _pinned(self, step: Step) -> Iterator[None]:
        """For a step with client_cpus: this thread, and the clients it starts, on those CPUs;
        the step's server (start's `cpus`) on every other CPU this process may use."""
        if not step.client_cpus:
            yield
            return
        every = os.sched_getaffinity(0)
        client = frozenset(step.client_cpus)
        if not client < every:
            raise ProofError(f"{step.name()}: client_cpus {sorted(client)}: give CPUs of "
                             f"{sorted(every)} and leave at least one for the server")
        self.server_cpus = frozenset(every - client)
        self.results.setdefault("cpus", {})[step.name()] = {
            "client": sorted(client), "server": sorted(self.server_cpus)}
        os.sched_setaffinity(0, client)
        try:
            yield
        finally:
            os.sched_setaffinity(0, every)
            self.server_cpus = None

    def _interrupted(self, signum: int, frame: object) -> None:
        self.cut_at = self.phase
        raise KeyboardInterrupt

    def _cut(self, name: str) -> None:
        what, since = self.cut_at or self.phase
        self.results.setdefault("failed", {})[name] = (
            f"cut off (time limit) while {what or 'starting'}, "
            f"{time.monotonic() - since:.0f} s into it" if since else "cut off (time limit)")
        if self.log and self.log.exists():
            tail = self.log.read_text(errors="replace").splitlines()[-CUT_LOG_LINES:]
            self.results.setdefault("cut_log", {})[name] = tail

    def load(self) -> None:
        if self.doc_path.exists():
            self.results = json.loads(self.doc_path.read_text())

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        text = bench.results_json(self.results, indent=1, sort_keys=True) + "\n"
        self.doc_path.write_text(text)
        # On the GPU machine the results accumulate in --out across calls while only $OUT comes
        # back, and a call killed at its limit runs no `cp` after the proof: a copy at every save.
        if mirror := self._mirror():
            (mirror / "proof.json").write_text(text)

    def _mirror(self) -> Path | None:
        """$OUT where it is a folder other than --out: what a GPU machine's call sends back."""
        mirror = os.environ.get("OUT")
        if mirror and Path(mirror).is_dir() and Path(mirror).resolve() != self.out.resolve():
            return Path(mirror)
        return None

    def resolved(self, sets: tuple[str, ...] = ()) -> Resolved:
        return resolve(self.plan.tier, overrides=list(sets))

    def step_resolved(self, step: Step) -> Resolved:
        """The tier with the step's --set overrides; a bad override is the step's one-line
        failure (ProofError), not the proof's."""
        try:
            return self.resolved(step.sets)
        except ProfileErrors as exc:
            raise ProofError(str(exc)) from None

    def model_for(self, r: Resolved, checkpoint: bool | None = None,
                  scales: str = "") -> Path:
        """The stand-in folder of the profile's target: its FP8 checkpoint where the profile
        loads one (or `checkpoint` says so), scaled as the catalog's (or as `scales`), else
        bf16."""
        target = r.profile.model.target
        if target not in TARGETS:
            raise ProofError(f"no stand-in for {target} (have: {', '.join(TARGETS)})")
        fp8 = r.profile.model.quantization == "fp8-checkpoint" if checkpoint is None else checkpoint
        bf16, prefix = TARGETS[target]
        suffix = bf16
        if fp8 and prefix is not None:
            if scales and scales not in FP8_STANDIN:
                raise ProofError(f"fp8_scales {scales!r}: want one of {', '.join(FP8_STANDIN)}")
            scales = scales or r.target.fp8_scales or ""
            if scales not in FP8_STANDIN:
                raise ProofError(f"{target} names no FP8 checkpoint scaling (catalog fp8_scales)")
            suffix = prefix + FP8_STANDIN[scales][0]
        return self.model_dir.with_name(f"{self.model_dir.name}-{suffix}") if suffix else self.model_dir

    def draft_for(self, r: Resolved) -> Path:
        draft = r.profile.model.speculative.draft
        if draft is None:  # no draft model: nothing reads the path
            return self.model_dir.with_name(f"{self.model_dir.name}-draft")
        if draft not in DRAFTS:
            raise ProofError(f"no stand-in for the draft {draft} (have: {', '.join(DRAFTS)})")
        return self.model_dir.with_name(f"{self.model_dir.name}-{DRAFTS[draft][0]}")

    def made(self, path: Path) -> Path:
        """`path`, a stand-in folder beside MODEL_DIR, made by the models step first where this
        machine has none yet. A fresh GPU machine's first serving step without `models` otherwise
        failed inside vLLM's start with the hub's "Repo id must be in the form ..." for the
        missing folder (a machine handed back between calls comes back bare)."""
        if path == self.model_dir or path.is_dir():  # MODEL_DIR itself: the unpack's, not ours
            return path
        if not (self.model_dir / "config.json").is_file():
            raise ProofError(f"MODEL_DIR {self.model_dir} has no config.json: unpack the test "
                             "model (config and tokenizer) there, or point MODEL_DIR at it")
        print(f"{path.name} is not beside {self.model_dir} yet: making the stand-ins (the models "
              "step) first", flush=True)
        self.results["models"] = make_models(self.model_dir)  # every folder model_for/draft_for name
        return path

    def run(self) -> None:
        self.load()
        # One --out holds one tier's steps: its table reads every row against that tier's render
        # (the roofline's model bytes, the published acceptance), and `proof record` reads the
        # tier from here when a run spans tiers (machines of two GPU models).
        had = self.results.get("tier")
        if had and had != self.plan.tier:
            raise ProofError(f"--out {self.out} holds tier {had}'s steps, not {self.plan.tier}'s. "
                             "Fix: give this tier its own --out")
        self.results["tier"] = self.plan.tier
        self._note_machine()
        # `timeout` (the GPU machine's call limit) sends SIGTERM: end like Ctrl-C, so the step's
        # server is stopped and what was measured is saved.
        before = {sig: signal.signal(sig, self._interrupted)
                  for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._run_steps()
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _run_steps(self) -> None:
        for step in self.plan.steps:
            t0 = time.monotonic()
            print(f"=== {step.name()} ({step.kind}) {time.strftime('%H:%M:%S')}", flush=True)
            self.results.get("failed", {}).pop(step.name(), None)
            self.results.get("cut_log", {}).pop(step.name(), None)
            self.phase, self.log, self.cut_at = ("", 0.0), None, None
            if step.name() in self.results.get("partial", []):
                self.results["partial"].remove(step.name())
            try:
                with self._pinned(step):
                    STEPS[step.kind](self, step)
            except ProofError as exc:
                print(f"[{step.name()}] FAILED: {exc}", flush=True)
                self.results.setdefault("failed", {})[step.name()] = str(exc)[:2000]
            except KeyboardInterrupt:
                self._cut(step.name())
                self.save()
                raise
            self.results.setdefault("step_seconds", {})[step.name()] = round(
                time.monotonic() - t0, 1)
            self.save()

    def _bench(self, label: str, port: int, model: str, conc: tuple[int, ...],
               r: Resolved | None, scenarios: tuple[str, ...] = (),
               sampling: str = "checkpoint") -> None:
        url = f"http://127.0.0.1:{port}"
        before = engine_counters(url)
        partial = self.work / "bench" / f"{label}.json"
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.unlink(missing_ok=True)
        try:
            rows = self._bench_rows(label, port, model, list(conc or self.plan.concurrency), r,
                                    scenarios, metrics_url=url, partial=partial,
                                    sampling=sampling)
        except BaseException:
            # A failed or cut-off bench keeps the rows it finished, marked partial.
            if partial.exists():
                rows = json.loads(partial.read_text())["runs"]
                self.results.setdefault("runs", {})[label] = rows
                self.results.setdefault("partial", []).append(label)
            raise
        self.results.setdefault("runs", {})[label] = rows
        self.results.setdefault("spec_total", {})[label] = acceptance(before, engine_counters(url))

    def _bench_rows(self, label: str, port: int, model: str, conc: list[int], r: Resolved | None,
                    scenarios: tuple[str, ...] = (), sampling: str = "checkpoint",
                    **extra: Any) -> list[dict[str, Any]]:
        """bench's rows for the server on `port` (chat unless `scenarios` names others), run the
        way every proof step runs them; `sampling`: Step.sampling. The stand-ins' configs carry no
        sampling, so the rows send the checkpoint's where it is the source: what the image, which
        serves the real checkpoint, samples a request that sets none with."""
        gpus_benched = 0
        if r is not None:
            insts = r.instances if port == r.profile.router.internal_port else [
                i for i in r.instances if i.port == port] or r.instances[:1]
            gpus_benched = sum(max(1, len(i.gpu_ids)) for i in insts)
        return bench.run(url=f"http://127.0.0.1:{port}", model=model, tokenizer=str(self.model_dir),
                         scenarios=list(scenarios or ("chat",)), concurrency=conc, config=label,
                         vllm_cmd=[self.python, "-m", "vllm.entrypoints.cli.main"],
                         vllm_python=self.python, min_prompts=self.plan.min_prompts,
                         per=self.plan.prompts_per_concurrency,
                         log=self.work / "logs" / f"{label}.bench.log",
                         # one instance's GPUs (the served step's router rows: all of them)
                         hourly_usd=(r.profile.digitalocean.price_per_gpu_hour * gpus_benched
                                     if r else 0.0),
                         sampling=(self.resolved().target.generation_defaults
                                   if sampling == "checkpoint" else {}),
                         **extra)["runs"]

    def _start(self, label: str, argv: list[str], env: dict[str, str], port: int) -> Server:
        """A step's server, its log under work/logs/LABEL.log, on the server's CPUs."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        log = self.work / "logs" / f"{label}.log"
        self._phase("starting the server", log)
        return start(argv, env, log, port, cpus=self.server_cpus)

    def _fresh(self, kind: str, label: str) -> Path:
        """An empty folder work/KIND/LABEL for what a step's server writes (a trace, samples)."""
        folder = self.work / kind / label
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def _serve(self, label: str, argv: list[str], env: dict[str, str], port: int, model: str,
               step: Step, r: Resolved | None, cache: Path) -> None:
        warm = compiled_into(cache)
        srv = self._start(label, argv, env, port)
        try:
            ready = srv.wait_ready()
            self.results.setdefault("ready_s", {})[label] = {"s": ready, "compile_cache":
                                                             "warm" if warm else "cold"}
            print(f"[{label}] ready after {ready} s ({'warm' if warm else 'cold'} cache)",
                  flush=True)
            self._phase("the greedy check")
            self.results.setdefault("greedy", {})[label] = greedy(f"http://127.0.0.1:{port}",
                                                                  model)
            self._settle(label, port, model, r)
            self._phase("the bench rows")
            self._bench(label, port, model, step.concurrency, r, step.scenarios, step.sampling)
            if step.prompt_tokens:
                self._phase("the first-token probes")
                probe = first_token_probes(f"http://127.0.0.1:{port}", model, step.prompt_tokens,
                                           bench.SCENARIOS["chat"].output_len,
                                           step.first_token_prefix)
                self.results.setdefault("first_token", {})[label] = probe
                print(f"[{label}] first token, median ms: idle {probe['idle_median_ms']}, "
                      f"after a {probe['answer_tokens']}-token answer "
                      f"{probe['after_answer_median_ms']}", flush=True)
        except bench.BenchError as exc:
            raise ProofError(str(exc)) from None
        finally:
            self._phase("stopping the server")
            srv.stop()
            self.results.setdefault("backends", {})[label] = backends(srv.log)

    def _sampling_checks(self, label: str, port: int, model: str) -> None:
        checks = sampling_checks(port, model, self.resolved().target.generation_defaults)
        self.results.setdefault("sampling_checks", {})[label] = checks
        failed = [c for c in checks if not c["ok"] and not (c.get("refused") and
                                                            c["serving_after"])]
        if failed:
            raise ProofError(f"{label}: {len(failed)} of {len(checks)} sampling requests failed, "
                             f"first {failed[0]['name']} {failed[0]['params']}: "
                             f"{failed[0]['error']}")

    def _settle(self, label: str, port: int, model: str, r: Resolved | None) -> None:
        """A server's first requests after its start are slower than the rest, the image's more
        than vanilla's, and every row list starts at c=1. So before its rows each server answers
        chat rows at SETTLE_CONCURRENCY on prompts
        of their own; the first is kept apart (`after_start`): what the first clients after a
        boot see; the others in `settle`. Before that it answers one request of each kind
        clients send (`sampling_checks`): every server a step starts, an instance of a layout
        and a router's too."""
        self._phase("the sampling checks")
        self._sampling_checks(label, port, model)
        self._phase("the rows after the start")
        rows = self._bench_rows(f"{label}-after-start", port, model, list(SETTLE_CONCURRENCY), r,
                                ("chat",), seed=SETTLE_SEED)
        self.results.setdefault("after_start", {})[label] = rows[0]
        self.results.setdefault("settle", {})[label] = rows[1:]

    def _cache_env(self, cache: Path) -> dict[str, str]:
        return {ENV.cache: str(cache), **{k: v for k, v in cache_env(str(cache)).items()
                                          if not k.startswith("XDG_")}}

    def step_vanilla(self, step: Step) -> None:
        """`vllm serve` with its defaults on the tier's target model in bf16, plus the step's
        `args` where vanilla needs them (vanilla_step: a tensor-parallel size; `--quantization
        fp8` where vLLM would not start in bf16 on those GPUs)."""
        r = self.resolved()
        port, name = r.instances[0].port, r.profile.model.target
        # one cache per command, not per label: a second start of the same vanilla (after a
        # cut-off call) would compile from cold under a new label
        cache = self.work / f"cache-vanilla-{hashlib.sha256(' '.join(step.args).encode()).hexdigest()[:12]}"
        argv = [self.python, "-m", "vllm.entrypoints.cli.main", "serve",
                str(self.made(self.model_for(r, checkpoint=False))), "--load-format", "dummy",
                "--served-model-name", name, "--port", str(port), *step.args]
        # the profile steps' shape (a dict with its argv as one shell line): the summary table
        # reads every step's entry alike (a list here crashed it)
        # vLLM's own top-p sampler, as the image's servers run (render.vllm_env): its default,
        # FlashInfer's, builds itself with nvcc, which neither the image nor a proof server has
        env = {**self._cache_env(cache), **NATIVE_SAMPLER}
        self.results.setdefault("commands", {})[step.name()] = {
            "sets": [], "argv": shlex.join(argv), "env": dict(NATIVE_SAMPLER)}
        self._serve(step.name(), argv, env, port, name, step, None, cache)

    def _plugin(self, env_file: Path | None) -> None:
        """A render that turns the project's vLLM plugin on needs it installed beside vLLM, or
        vLLM would quietly serve on its own kernels (None: install it whatever the render says).
        The copy vLLM imports must be this tree's: a machine kept warm between calls still has
        the one an earlier call installed, and a proof of changed plugin code would measure the
        old one. Each install leaves the tree's digest beside the package (PLUGIN_MARK)."""
        # the plugin's switches are the render's INFERENCE_IMAGE_* variables (only its)
        if env_file and not any(line.startswith("INFERENCE_IMAGE_")
                                for line in env_file.read_text().splitlines()):
            return
        want = plugin_digest()
        where = self._plugin_dir()
        if where and (where / PLUGIN_MARK).is_file() and \
                (where / PLUGIN_MARK).read_text().strip() == want:
            return
        site = os.environ.get("PROOF_SITE", "/tmp/site")
        proc = subprocess.run([self.python, "-m", "pip", "install", "-q", "--no-deps",
                               "--no-build-isolation", "--no-index", "--target", site, "--upgrade",
                               str(project_root() / "plugins" / "vllm")],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            said = (proc.stderr or proc.stdout).strip()[-400:]
            raise ProofError(f"the vLLM plugin did not install with {self.python} -m pip (exit "
                             f"{proc.returncode}{': ' + said if said else ''}). Fix: give "
                             "--python the Python that has vLLM and pip")
        where = self._plugin_dir()
        if where is None or where.parent.resolve() != Path(site).resolve():
            raise ProofError(f"the vLLM plugin was installed into {site}, but {self.python} "
                             f"imports it from {where}: put {site} first on PYTHONPATH")
        (where / PLUGIN_MARK).write_text(want + "\n")

    def _plugin_dir(self) -> Path | None:
        """Where self.python imports the plugin from (None: it does not)."""
        probe = subprocess.run([self.python, "-c", "import inference_image_vllm as m, os; "
                                "print(os.path.dirname(m.__file__))"],
                               capture_output=True, text=True, check=False)
        return Path(probe.stdout.strip()) if probe.returncode == 0 else None

    def _rendered(self, step: Step, extra_args: str = "") -> tuple[
            Resolved, dict[str, list[str]], dict[str, str], Path]:
        """The tier rendered as the image gets it, each instance's command (its inference-run,
        what systemd runs) and the environment they share; the step's acceptance and
        `extra_args` are the only changes."""
        label = step.name()
        r = self.step_resolved(step)
        table = self._fp8_table(step, r)
        rdir = self.work / "render" / label
        render(r, rdir)
        units = rdir / "etc/inference-image/units"
        if r.profile.serving.nodes > 1:
            try:
                group = nodes.prepare(rdir, r.profile.serving.nodes, list(r.instances[0].gpu_ids))
            except nodes.NodesError as exc:
                raise ProofError(f"{label}: {exc}") from None
            self.node_runs[label] = group[1:]
        length, rates = ((published_acceptance(r)) if step.published_acceptance
                         else (step.acceptance_length, step.acceptance_rates))
        span = published_length_range(r) if step.published_acceptance else None
        if span and span[0] != span[1] and r.draft:  # a range implies a draft
            k = r.profile.model.speculative.num_speculative_tokens
            print(f"[{label}] the published length {length} was measured with "
                  f"{r.draft.acceptance_length_tokens} draft tokens: a chain "
                  f"of {k} accepts {span[0]}-{span[1]} a step; measured at {length}", flush=True)
        spec = r.profile.model.speculative
        matched_only = False
        if length is not None or rates:
            for inst in r.instances:
                with_acceptance(units / f"{inst.name}.args", length, rates)
            # with_acceptance refused a render that does not speculate: what has no draft looks up
            matched_only = not spec.uses_draft
            if matched_only:
                # vLLM's synthetic sampler rejects an empty slot (-1) whatever the rate: a lookup
                # that matched nothing accepts nothing
                print(f"[{label}] {spec.method} drafts only where an "
                      f"n-gram of the text matches: the set acceptance applies to matched slots "
                      f"only, and the bench rows say how many there were", flush=True)
        self._plugin(units / f"{r.instances[0].name}.env")
        # One compile cache per render, less its HOST_ONLY settings: those and a synthetic
        # acceptance length change no graph, so the starts after the first are warm (their ready
        # time says so).
        cache = self.work / f"cache-{self.resolved((*step.sets, *HOST_ONLY)).digest[:12]}"
        draft = self.draft_for(r)
        target = self.made(self.model_for(r, scales=step.fp8_scales))
        if spec.draft:
            draft = self.made(draft)
        load = "--load-format dummy"
        if step.weight_files:
            target, *drafts = self._weight_files(step, [target, *([draft] if spec.draft else [])])
            draft = drafts[0] if drafts else draft
            load = ""
        env = {ENV.root: str(rdir), ENV.python: self.python,
               # the stand-ins' one correction (standin/sitecustomize.py): a weightless EAGLE-3
               # head keeps the lm_head its checkpoint has instead of borrowing the target's
               "PYTHONPATH": os.pathsep.join(x for x in (str(STANDIN), os.environ.get(
                   "PYTHONPATH", "")) if x),
               "MODEL_PATH": str(target),
               # no draft (method none, a lookup): nothing reads the path, so nothing is made
               "DRAFT_PATH": str(draft),
               ENV.extra_args: f"{load} {extra_args}".strip(),
               **self._cache_env(cache), **({FP8_TABLE_ENV: str(table)} if table else {})}
        if label in self.node_runs:  # inference-join finds the group's addresses with `ip`
            env["PATH"] = nodes.path_with_ip(os.environ.get("PATH", ""))
            # a node's stage runs `vllm serve --headless`: vLLM's console script, which the
            # carried wheels lack (the head runs `python -m`, as the image does)
            env[ENV.vllm] = str(nodes.vllm_script(self.work / "bin", self.python))
        runners = {i.name: runtime("run", i.name) for i in r.instances}
        argv = {name: dry_run(runner, env) for name, runner in runners.items()}
        for node in self.node_runs.get(label, []):
            argv[f"{r.instances[0].name} node {node.rank}"] = dry_run(
                node.runner(r.instances[0].name), {**env, **node.env()})
        self.results.setdefault("commands", {})[label] = {
            "sets": list(step.sets), **({"fp8_scales": step.fp8_scales} if step.fp8_scales
                                        else {}),
            **({"fp8_table": step.fp8_table} if step.fp8_table else {}),
            "acceptance_length": length or (
                mean_length(rates) if rates else None), "acceptance_rates": list(rates),
            **({"published_length_range": list(span)} if span else {}),
            **({"acceptance_applies_to": "matched n-gram slots only"} if matched_only else {}),
            "profile_sha256": r.digest,
            # the plugin's code is part of what serves: two labels of one render may differ here
            "plugin_sha256": plugin_digest(),
            **({"argv": argv[r.instances[0].name]} if len(argv) == 1 else {"argv": argv})}
        return r, runners, env, cache

    def _weight_files(self, step: Step, folders: list[Path]) -> list[Path]:
        """The stand-in `folders` with weight files, under `step.weight_files` (written once a
        machine: a folder written from the same config is kept), recorded under weight_files."""
        got = []
        for src in folders:
            dest = Path(step.weight_files) / src.name
            self._phase(f"stand-in weight files of {src.name} under {step.weight_files}")
            try:
                done = standin_weights.write(src, dest)
            except (standin_weights.StandinError, OSError) as exc:
                raise ProofError(f"{step.name()}: weight files for {src.name}: {exc}") from None
            self.results.setdefault("weight_files", {})[src.name] = done
            print(f"[{step.name()}] {src.name}: {done['bytes'] / 2**30:.1f} GiB in "
                  f"{done['files']} files under {dest} "
                  f"({'kept' if done.get('kept') else str(done['s']) + ' s'})", flush=True)
            got.append(dest)
        return got

    def _fp8_table(self, step: Step, r: Resolved) -> Path | None:
        """The FP8 table the step serves in place of the packaged one (None: the packaged one)."""
        if not step.fp8_table:
            return None
        if not r.profile.serving.fp8_gemm_dispatch:
            raise ProofError(f"fp8_table {step.fp8_table}: the render does not turn the plugin's "
                             "FP8 dispatch on (serving.fp8_gemm_dispatch), so no table is read; "
                             "drop fp8_table or --set serving.fp8_gemm_dispatch=true")
        table = self.out / TUNED_TABLE
        if not table.is_file():
            raise ProofError(f"fp8_table tuned: no table at {table}; run `proof step tune` with "
                             "the same --out first (it measures this GPU's)")
        return table

    def _instance(self, step: Step, extra_args: str = "") -> tuple[Resolved, list[str],
                                                                    dict[str, str], int, Path]:
        """The render's first instance (single-instance tiers: the whole machine)."""
        r, runners, env, cache = self._rendered(step, extra_args)
        inst = r.instances[0]
        return r, runners[inst.name], env, inst.port, cache

    def _start_instances(self, label: str, r: Resolved, runners: dict[str, list[str]],
                         env: dict[str, str], cache: Path, servers: list[Server]) -> None:
        """Every instance of the render, one after the other (the later ones on the first's
        compile cache), each added to `servers` as it starts so that the caller stops it whatever
        fails next; ready times under `label` (several instances: `label-vllm-N`)."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        cached = "warm" if compiled_into(cache) else "cold"
        for inst in r.instances:
            srv = start(runners[inst.name], env, self.work / "logs" / f"{label}-{inst.name}.log",
                        inst.port)
            servers.append(srv)
            key = f"{label}-{inst.name}" if len(r.instances) > 1 else label
            self.results.setdefault("ready_s", {})[key] = {
                "s": srv.wait_ready(), "compile_cache": "shared" if servers[:-1] else cached}

    def step_layout(self, step: Step) -> None:
        """Every instance of the render started, one after the other (the later ones on the
        first's compile cache), and the load spread evenly over them: at each concurrency c every
        instance is benched at c/N at the same time and the rows are summed (tok/s) or averaged
        by request (latencies; p99: the worst instance's). What a multi-instance tier serves
        behind its router, with the clients standing in for the router's round robin (`served`
        benches through the render's own router)."""
        label = step.name()
        n = len(self.step_resolved(step).instances)
        # each scenario's concurrencies (its own, or the step's) that split evenly over the
        # instances, checked before anything is rendered, installed or started
        per_scenario: list[tuple[str, list[int]]] = []
        for spec in step.scenarios or ("chat",):
            sc, own = scenario_spec(spec)
            cs = [c for c in (own or step.concurrency or self.plan.concurrency) if c % n == 0]
            if not cs:
                raise ProofError(f"{label}: no concurrency of {spec} divides over {n} instances")
            per_scenario.append((sc, cs))
        r, runners, env, cache = self._rendered(step)
        servers: list[Server] = []
        try:
            self._start_instances(label, r, runners, env, cache, servers)
            # each row joins the record as it is summed: a cut-off step keeps the rows it finished
            rows = self.results.setdefault("runs", {}).setdefault(label, [])
            model = r.profile.model.target
            for inst in r.instances:
                self._settle(f"{label}-{inst.name}", inst.port, model, r)
            with ThreadPoolExecutor(n) as pool:
                for sc, cs in per_scenario:
                    for c in cs:
                        # every instance at c/n at the same time; a failed bench raises here
                        parts = [pool.submit(self._bench_rows, f"{label}-{i.name}-{sc}-c{c}",
                                             i.port, model, [c // n], r, (sc,), step.sampling)
                                 for i in r.instances]
                        rows.append(sum_rows(c, [f.result()[0] for f in parts]))
        except bench.BenchError as exc:
            raise ProofError(str(exc)) from None
        finally:
            for srv in servers:
                srv.stop()
            self.results.setdefault("backends", {})[label] = backends(
                self.work / "logs" / f"{label}-{r.instances[0].name}.log")

    def step_served(self, step: Step) -> None:
        """The tier as its clients reach it behind nginx: every instance of the render and, in
        front, the render's own vllm-router (`inference-run router`: its policy and health checks
        as the image starts them), benched through the router (`<label>`) and, on a one-instance
        tier, at the instance too on the same start (`<label>-direct`, first; the router's rows
        on prompts of other seeds, so that neither finds the other's in the prefix cache): what
        the router costs a request. nginx (TLS, the API key) is left out: the GPU machine has
        none. The router binary: $PROOF_ROUTER_BIN, else `vllm-router` beside this Python or on
        PATH (carried as wheels, docs/gpu-machine.md)."""
        label = step.name()
        router = router_bin(self.python)
        r, runners, env, cache = self._rendered(step)
        model = r.profile.model.target
        servers: list[Server] = []
        conc = list(step.concurrency or self.plan.concurrency)
        try:
            self._start_instances(label, r, runners, env, cache, servers)
            rport = r.profile.router.internal_port
            # the instances' extra arguments (--load-format dummy) are not the router's
            renv = {**env, "ROUTER_BIN": router, ENV.extra_args: ""}
            runner = runtime("run", "router")
            srv = start(runner, renv, self.work / "logs" / f"{label}-router.log", rport)
            servers.append(srv)
            self.results.setdefault("ready_s", {})[f"{label}-router"] = {
                "s": srv.wait_ready(120), "compile_cache": "none"}
            self.results["commands"][label]["router_argv"] = dry_run(runner, renv)
            one = r.instances[0].port if len(r.instances) == 1 else None
            # every instance's counters, summed: the router decides which served a request
            metrics = [f"http://127.0.0.1:{i.port}" for i in r.instances]
            self._settle(label, rport, model, r)
            runs = self.results.setdefault("runs", {})
            if one:
                runs[f"{label}-direct"] = self._bench_rows(
                    f"{label}-direct", one, model, conc, r, step.scenarios, step.sampling,
                    metrics_url=metrics)
            runs[label] = self._bench_rows(label, rport, model, conc, r, step.scenarios,
                                           step.sampling, metrics_url=metrics,
                                           seed=SERVED_SEED)
        except bench.BenchError as exc:
            raise ProofError(str(exc)) from None
        finally:
            for srv in reversed(servers):
                srv.stop()
            self.results.setdefault("backends", {})[label] = backends(
                self.work / "logs" / f"{label}-{r.instances[0].name}.log")

    def _start_nodes(self, label: str, unit: str, env: dict[str, str]) -> list[Server]:
        """The stages of a render over several nodes besides the head's, each as a droplet of
        the tier runs it (`inference-run` on its own copy of the render), started before the
        head, which answers /health once they have joined it."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        started = []
        for node in self.node_runs.get(label, []):
            # a node serves no HTTP: its port is only start's check that nothing answers there
            started.append(start(node.runner(unit), {**env, **node.env()},
                                 self.work / "logs" / f"{label}-node{node.rank}.log", 0,
                                 self.server_cpus))
        return started

    def _stop_nodes(self, label: str, started: list[Server]) -> None:
        for srv in started:
            code = srv.proc.poll()
            srv.stop()
            self.results.setdefault("backends", {})[srv.log.stem] = backends(srv.log)
            if code:  # a node that died first is why its head failed: say so in the record
                self.results.setdefault("node_exits", {})[srv.log.stem] = {
                    "exit": code, "cause": failure_cause(srv.log.read_text(errors="replace"))}

    def step_profile(self, step: Step) -> None:
        r, runner, env, port, cache = self._instance(step)
        label = step.name()
        if label in self.node_runs:
            started = self._start_nodes(label, r.instances[0].name, env)
            try:
                self._serve(label, runner, env, port, r.profile.model.target, step, r, cache)
            finally:
                self._stop_nodes(label, started)
            return
        if len(r.instances) > 1:
            # one instance of several (h100x8's first pair of GPUs): its rows are that
            # instance's, and the record says so beside the command
            first = r.instances[0]
            self.results["commands"][step.name()]["instances_served"] = (
                f"{first.name} of {len(r.instances)} (GPUs "
                f"{','.join(str(g) for g in first.gpu_ids)}); the others not started")
        self._serve(step.name(), runner, env, port, r.profile.model.target, step, r, cache)


# The step kinds and the Runner method each runs: every kind a plan may name (KINDS), once.
STEPS: dict[str, Callable[[Runner, Step], None]] = {
    "info": lambda r, s: r.step_info(s), "bandwidth": lambda r, s: r.step_bandwidth(s),
    "gemm": lambda r, s: r.step_gemm(s), "attention": lambda r, s: r.step_attention(s),
    "tune": lambda r, s: r.step_tune(s), "models": lambda r, s: r.step_models(s),
    "vanilla": lambda r, s: r.step_vanilla(s), "profile": lambda r, s: r.step_profile(s),
    "layout": lambda r, s: r.step_layout(s), "served": lambda r, s: r.step_served(s),
    "trace": lambda r, s: r.step_trace(s), "stacks": lambda r, s: r.step_stacks(s),
    "choose": lambda r, s: r.step_choose(s), "cannot_start": lambda r, s: r.step_cannot_start(s),
    "ready": lambda r, s: r.step_ready(s), "assemble": lambda r, s: r.step_assemble(s),
}

# What tests and scripts read as proof.X: the names of the modules the proof is split into.
__all__ = [
    "BESIDE_TOKENS", "CHAT_CONCURRENCY", "CUT_LOG_LINES", "FP8_TABLE_ENV", "KINDS", "NO_CUDA_HOME",
    "NO_DRAFT", "PLUGIN_MARK", "SAMPLINGS", "SERVED_SEED", "SETTLE_CONCURRENCY", "SETTLE_SEED",
    "STANDIN", "STEPS", "TUNED_TABLE", "Plan", "ProofError", "Runner", "Step",
    "acceptance_needed", "assemble", "attention_lines", "bench", "choose_layout",
    "decode_streams", "first_token_probes", "first_tokens", "layout_candidates", "layout_plan",
    "make_models", "mean_length", "parse_engine_steps", "plugin_digest", "published_acceptance",
    "published_length_range", "published_rates", "router_bin", "sampling_checks", "serving",
    "shared_prefix", "standard_plan", "start", "step_problem", "sum_rows", "tune_models",
    "vanilla_step", "with_acceptance", "without_cuda_compiler",
]
