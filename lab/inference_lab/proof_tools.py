"""The GPU proof's steps that measure parts (the machine, kernels, traces, stacks) rather than
serve a render's rows; the Runner takes them from this mixin."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference_image.ops.cause import CPU_NO_MEMORY, ROOT_CAUSE, failure_cause
from inference_machine.bounded_http import fetch

from . import gpu_bench, stacks, trace
from .proof_machine import BESIDE_TOKENS, DECODE_WINDOW_S, STACKS_WINDOW_S, machine_info, start
from .proof_plan import ATTENTION_CONTEXTS, TUNED_TABLE, ProofError, Step, choose_layout
from .proof_probes import (
    cache_prefix,
    decode_streams,
    engine_steps,
    first_tokens,
    greedy,
    make_models,
    tune_models,
    wait_files,
)
from .proof_report import assemble
from .trace import middle


class ToolSteps:
    """Steps of the Runner (proof.py) that measure parts, not served rows."""

    def step_info(self, step: Step) -> None:
        if shutil.which("nvidia-smi") is None:
            raise ProofError("no nvidia-smi here: the proof's steps run on the GPU machine, with "
                             "its driver (docs/benchmarks.md gives each run's commands)")
        self.results["info"] = machine_info(self.python)
        print(self.results["info"])

    def _note_machine(self) -> None:
        """Every --out says which machine it ran on, info step or not (a run that skips the
        info step to save device time still names its GPUs): a lender may hand two
        calls of one session two machines, and only the serials tell them apart."""
        if "info" in self.results or shutil.which("nvidia-smi") is None:
            return
        if any(step.kind == "info" for step in self.plan.steps):
            return
        self.results["info"] = machine_info(self.python)
        print(f"machine: {self.results['info']}", flush=True)

    def step_bandwidth(self, step: Step) -> None:
        # In a child: CUDA memory this process held would be missing from every server started
        # after it, and a vanilla server beside it could run out of memory.
        self.results["bandwidth"] = self._child("bandwidth")
        print(self.results["bandwidth"])

    def _child(self, fn: str, **kwargs: Any) -> Any:
        """gpu_bench.FN(**kwargs) in a child process: its CUDA memory goes back when it ends."""
        code = ("import json, sys; from inference_lab import gpu_bench; "
                f"print(json.dumps(gpu_bench.{fn}(**json.loads(sys.argv[1]))))")
        proc = subprocess.run([self.python, "-c", code, json.dumps(kwargs)], capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            raise ProofError(f"{fn}: {proc.stderr.strip()[-800:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def step_gemm(self, step: Step) -> None:
        """Llama-3.1-8B's decode GEMMs at 1 and 64 rows, bf16 against FP8 (Cutlass, cuBLASLt):
        what bounds one stream's token time before attention and overheads."""
        rows = self._child("gemm")
        self.results["gemm"] = rows
        for row in rows:
            print(row)

    def step_attention(self, step: Step) -> None:
        """One layer's attention for the steps the plugin's Triton route takes (a verify step at
        c=1 and 2, the draft's one-token passes), FA3 against the route at 16 (vLLM's count), 32,
        64 and 128 split-KV segments, from 256 cached tokens to the profile's context limit: where the
        route pays, as the context a tier serves grows."""
        r = self.step_resolved(step)
        serving, t = r.profile.serving, r.target
        if not serving.triton_decode_max_tokens:
            raise ProofError(f"attention: the {r.profile.tier} profile sends no step to Triton "
                             "(serving.triton_decode_max_tokens is 0): nothing to time")
        if r.profile.model.kv_cache_dtype != "fp8":
            raise ProofError(f"attention: times an FP8 KV cache, and the {r.profile.tier} profile "
                             f"has model.kv_cache_dtype: {r.profile.model.kv_cache_dtype}")
        self._plugin(None)
        k = r.profile.model.speculative.num_speculative_tokens
        # the longest context a verify step can have, capped where the caches' memory stays small
        top = min(serving.max_model_len, ATTENTION_CONTEXTS[-1])
        contexts = sorted({c for c in ATTENTION_CONTEXTS if c < top} | {top - k - 1})
        # the rows' shapes: the timings read alike for every model with these KV heads
        shape = {"heads": t.num_attention_heads, "kv_heads": t.num_kv_heads, "head": t.head_dim,
                 "max_tokens": serving.triton_decode_max_tokens, "k": k}
        timed = self._child("attention_route", **shape, contexts=contexts)
        rows = self.results["attention"] = timed["rows"]
        # microseconds mean nothing without the GPU they ran on, and this step is often run
        # alone, with an --out of its own and no info step
        self.results["attention_model"] = {
            "gpu": timed["gpu"],
            "target": r.profile.model.target, **shape, "kv_cache_dtype": "fp8",
            "calls_per_graph": gpu_bench.ATTENTION_CALLS,
            "fa3": f"scheduler plan made ahead, at most {gpu_bench.FA3_GRAPH_SPLITS} splits (as "
                   "in vLLM's full graphs)"}
        for row in rows:
            print(row)

    def step_tune(self, step: Step) -> None:
        """The plugin's FP8 kernel table measured on this GPU (Cutlass against cuBLASLt and the
        Triton GEMV at every CUDA-graph batch size), written under --out. The proof's serving
        steps keep measuring the table the image ships (unless a step's `fp8_table: tuned` serves
        this one); to ship it, commit it as the plugin's tables/<gpu-name>.json."""
        self._plugin(None)
        table, report = self.out / TUNED_TABLE, self.out / "fp8-report.json"
        self.out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([self.python, "-m", "inference_image_vllm.tune", "--table",
                               str(table), "--report", str(report),
                               *tune_models(self.resolved())], capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            table.unlink(missing_ok=True)
            raise ProofError(f"tune: {proc.stderr.strip()[-800:]}")
        doc = json.loads(table.read_text())
        # The table and its measurements go into proof.json too: on the GPU machine only $OUT
        # comes back, and proof.json is what is copied there at every save.
        self.results["tune"] = {"table": str(table), "report": str(report),
                                "shapes": sorted(doc.get("shapes", {})), "table_doc": doc,
                                "report_doc": json.loads(report.read_text())}
        print({k: v for k, v in self.results["tune"].items() if not k.endswith("_doc")})

    def step_models(self, step: Step) -> None:
        self.results["models"] = make_models(self.model_dir)

    def step_trace(self, step: Step) -> None:
        """The profile as imaged under vLLM's torch profiler: warmed up, then traced and the trace
        summarised (trace.py): where a step's GPU time goes, how long the GPU idles. Decode (the
        default): one stream of greedy completions, the speculative steps included. With a
        concurrency c > 1: c streams at once, traced for DECODE_WINDOW_S once all are decoding (a
        chat row's steady state at c); with several, each in turn in the one start (labelled
        LABEL-cC), so that neighbours compare on one machine without a second 70B start. With
        prompt_tokens: the first token of long prompts, one at a time, timed first without the
        profiler (first_tokens), so the trace explains a measured TTFT; with prompt_tokens and a
        concurrency c, those prompts are sent while c other streams decode (a bench row's later
        requests, where a first token can wait longer than on an idle server, which the idle
        trace cannot show), and the steps around each prompt's are listed
        (trace.prompt_steps). With first_token_prefix: every one of those prompts begins with the
        same tokens, cached in the warm-up, so each traced first token reads a prefix-cache
        hit."""
        label = step.name()
        tdir = self._fresh("trace", label)
        # no spaces: inference-run splits INFERENCE_EXTRA_ARGS on them
        cfg = json.dumps({"profiler": "torch", "torch_profiler_dir": str(tdir),
                          "torch_profiler_with_stack": False, "ignore_frontend": True},
                         separators=(",", ":"))
        r, runner, env, port, _ = self._instance(step, f"--profiler-config {cfg}")
        srv = self._start(label, runner, env, port)
        url, model = f"http://127.0.0.1:{port}", r.profile.model.target
        n, pre = step.prompt_tokens, step.first_token_prefix
        beside = max(step.concurrency, default=0) if n else 0
        levels = sorted(set(step.concurrency)) if step.concurrency and not n else [1]
        # each GPU worker writes its own trace
        workers = r.profile.serving.tensor_parallel_size
        pattern = "*.pt.trace.json*"

        def profile(action: str) -> None:
            a = fetch(f"{url}/{action}", deadline_s=600, method="POST")
            if a.status >= 400:
                raise OSError(f"{url}/{action}: HTTP {a.status}")

        def window() -> None:
            time.sleep(0.2)
            profile("start_profile")
            time.sleep(DECODE_WINDOW_S)
            profile("stop_profile")

        timed: dict[str, Any] = {}
        profiled: list[float] = []

        def traced(c: int, during: Callable[[], None]) -> None:
            # kept at once: a later concurrency that fails loses only its own trace
            seen = frozenset(tdir.glob(pattern))
            during()
            self._keep_trace(f"{label}-c{c}" if len(levels) > 1 else label,
                             wait_files(tdir, pattern, 300, seen, workers), c, n, pre, beside,
                             timed, profiled)

        try:
            srv.wait_ready()
            # warm-up: anything compiled on first use is compiled now
            greedy(url, model)
            if n:
                if pre:
                    cache_prefix(url, model, n, pre)
                first_tokens(url, model, n, n=4, seed=2, prefix=pre)
                # the server's default sampling (as bench sends it) and greedy, alternating
                sampled: list[float] = []
                greedy_ms: list[float] = []
                for i in range(8):
                    sampled += first_tokens(url, model, n, n=2, seed=30 + i, pause_s=0.1,
                                            prefix=pre)
                    greedy_ms += first_tokens(url, model, n, n=2, seed=40 + i, pause_s=0.1,
                                              temperature=0.0, prefix=pre)
                timed = {"prompt_tokens": n, "prefix_tokens": pre, "first_token_ms": sampled,
                         "first_token_ms_greedy": greedy_ms}
            if beside:
                # timed without the profiler, then traced: each prompt after a pause, the streams
                # decoding all the while (closed once the prompts are done, not read to their end)
                def timed_beside() -> None:
                    timed["first_token_ms_beside"] = first_tokens(url, model, n, n=8, seed=50,
                                                                  pause_s=0.2, prefix=pre)

                def traced_beside() -> None:
                    profile("start_profile")
                    profiled.extend(first_tokens(url, model, n, n=4, seed=1, pause_s=0.2,
                                                 prefix=pre))
                    profile("stop_profile")

                decode_streams(url, model, beside, timed_beside, max_tokens=BESIDE_TOKENS,
                               end_after=True)
                timed["beside_streams"] = beside
            self._phase("tracing")

            def one() -> None:
                profile("start_profile")
                if n:
                    # one token: each request is one engine step (prefill and first proposals),
                    # so the trace's pieces (trace.bursts) are those steps
                    profiled.extend(first_tokens(url, model, n, seed=1, max_tokens=1, prefix=pre))
                else:
                    greedy(url, model)
                profile("stop_profile")

            if beside:
                traced(beside, lambda: decode_streams(
                    url, model, beside, traced_beside, max_tokens=BESIDE_TOKENS, end_after=True))
            else:
                for c in levels:
                    traced(c, (lambda c=c: decode_streams(url, model, c, window)) if c > 1
                           else one)
        finally:
            srv.stop()

    def _keep_trace(self, label: str, files: list[Path], c: int, n: int, pre: int, beside: int,
                    timed: dict[str, Any], profiled: list[float]) -> None:
        """One trace of step_trace summarised into proof.json under `label`, its timeline kept
        beside it (traces/LABEL...)."""
        biggest = max(files, key=lambda f: f.stat().st_size)  # the GPU worker's, not the front end's
        # kept beside proof.json: the timeline itself answers what the summary does not
        kept = Path("traces") / f"{label}.pt.trace.json{'.gz' if biggest.suffix == '.gz' else ''}"
        for folder in (self.out, self._mirror()):
            if folder:
                (folder / kept).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(biggest, folder / kept)
        events = trace.load(biggest)
        summary = trace.summarize(events)
        summary["file"] = biggest.name
        summary["raw"] = str(kept)
        if c > 1 and not beside:
            summary["streams"] = c
        if n and not beside:
            summary["bursts"] = trace.bursts(events)
            summary["median_burst"] = trace.median_burst(summary["bursts"])
            # a hit leaves the pass at least the tokens past the prefix to read
            summary["prompt_passes"] = trace.prompt_passes(events, n - pre)
            summary["prompt_pass"] = trace.median_pass(summary["prompt_passes"])
        if beside:
            # a hit leaves the prompt's step at least the tokens past the prefix to read
            summary["prompt_steps"] = trace.prompt_steps(events, n - pre)
        if timed:
            timed["first_token_ms_profiled"] = profiled
            summary.update(timed)
            print(f"[{label}] first token of {n}-token prompts"
                  + (f" ({pre} of them cached)" if pre else "") + ", median ms: "
                  f"{middle(timed['first_token_ms'])} sampled, "
                  f"{middle(timed['first_token_ms_greedy'])} greedy"
                  + (f", {middle(timed['first_token_ms_beside'])} beside {beside} decoding "
                     "stream(s)" if beside else ""), flush=True)
        self.results.setdefault("trace", {})[label] = summary
        self.save()
        print(f"[{label}]", trace.table(summary), sep="\n", flush=True)
        if beside:
            print("\n".join(trace.prompt_steps_table(summary["prompt_steps"])), flush=True)

    def step_stacks(self, step: Step) -> None:
        """The profile as imaged with proof_stacks.py's sampler in each of its processes: c streams
        at once (the step's largest concurrency, default 64), sampled every millisecond for
        STACKS_WINDOW_S once all are decoding: where the host's time goes in a chat row's steady
        decode at c (stacks.py). The trace times only vLLM's execute_model on the host; this
        covers the engine core's whole loop, and the API server. The engine's step and token
        counts over the window turn shares into milliseconds a step."""
        label = step.name()
        sdir = self._fresh("stacks", label)
        r, runner, env, port, _ = self._instance(step)
        srv = self._start(label, runner, {**env, "PROOF_STACKS_DIR": str(sdir)}, port)
        url, model = f"http://127.0.0.1:{port}", r.profile.model.target
        streams = max(step.concurrency, default=64)
        counted: dict[str, float] = {}

        def window() -> None:
            time.sleep(0.2)
            steps0, tokens0 = engine_steps(url)
            t0 = time.monotonic()
            (sdir / "on").touch()
            time.sleep(STACKS_WINDOW_S)
            (sdir / "on").unlink()
            wall = time.monotonic() - t0
            steps1, tokens1 = engine_steps(url)
            counted.update(steps=steps1 - steps0, tokens=tokens1 - tokens0, wall_s=round(wall, 3))

        try:
            srv.wait_ready()
            greedy(url, model)  # warm-up: anything compiled on first use is compiled now
            self._phase("sampling")
            # answers that outlast the window at c=1 too, yet end soon after it at c=64 (a longer
            # answer ran a step past its time limit while finishing)
            decode_streams(url, model, streams, window, max_tokens=3072)
            time.sleep(1.0)  # each sampler writes its file once it sees the flag gone
        finally:
            srv.stop()
        summary = stacks.summarize(stacks.load(sdir))
        steps = counted.get("steps", 0.0)
        doc = {"streams": streams, "window_s": counted.get("wall_s"), "engine_steps": steps,
               "tokens": counted.get("tokens"),
               "step_period_ms": round(1e3 * counted["wall_s"] / steps, 3) if steps else None,
               "processes": summary}
        self.results.setdefault("stacks", {})[label] = doc
        print(f"[{label}] {streams} streams, {steps:.0f} engine steps in {counted.get('wall_s')} s "
              f"(a step every {doc['step_period_ms']} ms)\n{stacks.table(summary)}", flush=True)

    def step_cannot_start(self, step: Step) -> None:
        """The profile's instance started without the memory it needs (GPU tiers: vLLM's
        --gpu-memory-utilization 0.05 appended, below its weights; cpu: a 1 PB KV cache, as the
        faults suite does): it must end by itself, and its log must say why in one line, the line
        the smoke suite (and so `verify`) reports from the journal (cause.failure_cause). What
        systemd does next (restarts, the router serving on the other instances) the faults suite
        checks on the cpu tier: the GPU machine has no systemd."""
        label = step.name()
        r = self.resolved(step.sets)
        extra = "--gpu-memory-utilization 0.05" if r.is_gpu else ""
        fault = extra or "=".join(CPU_NO_MEMORY)
        r, runner, env, port, _ = self._instance(step, extra)
        if not r.is_gpu:
            env = {**env, CPU_NO_MEMORY[0]: CPU_NO_MEMORY[1]}
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        log = self.work / "logs" / f"{label}.log"
        srv = start(runner, env, log, port)
        try:
            srv.proc.wait(600)
        except subprocess.TimeoutExpired:
            raise ProofError(f"{label}: still running after 600 s without its memory") from None
        finally:
            srv.stop()
        cause = failure_cause(log.read_text(errors="replace"))
        seconds = round(time.monotonic() - srv.started, 1)
        self.results.setdefault("cannot_start", {})[label] = {
            "exit": srv.proc.returncode, "seconds": seconds, "cause": cause, "fault": fault}
        print(f"[{label}] exit {srv.proc.returncode} after {seconds} s: {cause}", flush=True)
        if srv.proc.returncode == 0 or not cause or not ROOT_CAUSE.search(cause):
            raise ProofError(f"{label}: exit {srv.proc.returncode}, and its log does not say "
                             f"why in a line the smoke suite would report (got: {cause})")

    def step_choose(self, step: Step) -> None:
        """The layout the measurements choose (choose_layout), and what to write in the profile."""
        r = self.resolved()
        choice = choose_layout(self.results.get("runs", {}), r)
        self.results["layout_choice"] = choice
        for e in choice["candidates"]:
            figures = (f"{e['output_tok_s']:.1f} tok/s, TTFT p99 {e['ttft_ms_p99']:.0f} ms"
                       if "output_tok_s" in e else "")
            print(f"{e['label']:<14}{figures:<36}{e.get('out', 'CHOSEN')}", flush=True)
        for c, at in choice["by_concurrency"].items():
            rates = ", ".join(f"{k} {v:.1f}" for k, v in at["tok_s"].items())
            print(f"c={c:<4} fastest {at['fastest'] or '-':<12} ({rates})", flush=True)
        if choice["chosen"] is None:
            raise ProofError(f"no layout of {r.profile.tier} met TTFT p99 <= "
                             f"{choice['ttft_p99_target_ms']:g} ms at c={choice['concurrency']}")
        n, tp = (int(x) for x in choice["chosen"].removeprefix("layout-").split("x"))
        verdict = "keeps its layout" if choice["chosen"] == choice["profile_now"] else "should change"
        print(f"{r.profile.tier} {verdict}: serving.instances: {n}, serving.tensor_parallel_size: "
              f"{tp}  # chosen by measurement: {choice['chosen']} at {choice['scenario']} "
              f"c={choice['concurrency']} (docs/benchmarks.md, this run)", flush=True)

    def step_assemble(self, step: Step) -> None:
        print(assemble(self.results, self.resolved()))


