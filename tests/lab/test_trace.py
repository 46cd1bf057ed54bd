"""The proof's trace summary (trace.py) on a small Chrome trace written as vLLM's torch profiler
writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from inference_lab import trace


def _k(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


EVENTS = [
    _k("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int>, "
       "cutlass_3x_sm90_tensorop_e4m3_128x64x128>>(Params)", 0, 38),
    _k("_fp8_gemv_kernel", 40, 20),
    _k("_fp8_gemv_kernel", 60, 20),
    _k("kernel_unified_attention_3d", 80, 10),
    _k("void vllm::rms_norm_kernel<c10::BFloat16>", 90, 5),
    _k("void vllm::scaled_fp8_quant_kernel", 95, 5),
    _k("Memcpy DtoH (Device -> Pinned)", 150, 10, "gpu_memcpy"),
    # on a second stream, overlapping the GEMM: counted once in busy time
    _k("void rejection_sample_kernel", 10, 20),
    {"ph": "X", "cat": "gpu_user_annotation", "name": "gpu_model_runner: forward", "ts": 0,
     "dur": 100},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "gpu_model_runner: forward", "ts": 150,
     "dur": 50},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 3},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 2},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # not GPU time
]


def test_summary_of_a_trace(tmp_path: Path) -> None:
    f = tmp_path / "host_1.pt.trace.json.gz"
    f.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    s = trace.summarize(trace.load(f))
    assert s["window_ms"] == 0.16  # first kernel start to last end
    assert s["gpu_busy_ms"] == 0.108  # 0-38, 40-100, 150-160: the overlapping kernel counts once
    assert s["gpu_idle_share"] == round(1 - 108 / 160, 4)
    assert s["by_kind_ms"] == {"gemm": 0.078, "sampling": 0.02, "attention": 0.01,
                               "memory": 0.01, "norm": 0.005, "quant": 0.005}
    top = s["top_kernels"][0]
    assert (top["name"], top["calls"], top["mean_us"]) == ("_fp8_gemv_kernel", 2, 20.0)
    assert s["top_kernels"][1]["name"].endswith("<...>")  # template arguments cut
    assert s["annotations"]["gpu_model_runner: forward"] == {"calls": 2, "mean_ms": 0.075}
    assert s["launches"] == {"cudaGraphLaunch": 1, "cudaLaunchKernel": 1}
    text = trace.table(s)
    assert "GPU busy 0.108 of 0.16 ms" in text
    # the kernels as a table: a header, then the heaviest first, its columns lined up
    head = next(ln for ln in text.splitlines() if "total ms" in ln)
    first = text.splitlines()[text.splitlines().index(head) + 1]
    assert head.split() == ["total", "ms", "calls", "mean", "us", "kind", "kernel"]
    assert first.split()[:4] == [f"{top['total_ms']:.2f}", "2", "20.0", top["kind"]]
    assert first.index("_fp8_gemv_kernel") == head.index("kernel")  # names on the left
    assert first.index("2 ") + 1 == head.index("calls") + len("calls")  # numbers on the right


def test_a_trace_without_gpu_events_says_so() -> None:
    s = trace.summarize([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}])
    assert "no GPU events" in s["error"] and trace.table(s) == s["error"]


def test_bursts_cut_the_timeline_where_the_gpu_idles() -> None:
    # two requests 10 ms apart; inside the first, a 1 ms host gap between two graph replays
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": -50, "dur": 5},
        _k("sm90_xmma_gemm_e4m3", 0, 400),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1200, "dur": 5},
        _k("void vllm::rms_norm_kernel<c10::BFloat16>", 1400, 100),
        _k("sm90_xmma_gemm_e4m3", 11500, 300),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 11400, "dur": 5},
    ]
    pieces = trace.bursts(events)
    assert [p["span_ms"] for p in pieces] == [1.5, 0.3]
    assert pieces[0]["busy_ms"] == 0.5  # the 1 ms between the two kernels is not GPU time
    assert pieces[0]["by_kind_ms"] == {"gemm": 0.4, "norm": 0.1}
    assert (pieces[0]["graph_launches"], pieces[0]["kernel_launches"]) == (1, 1)
    assert (pieces[1]["graph_launches"], pieces[1]["kernel_launches"]) == (1, 0)
    assert trace.median_burst(pieces) == pieces[0]
    assert trace.median_burst([]) == {}
    s = {**trace.summarize(events), "bursts": pieces, "median_burst": pieces[0]}
    assert "one request (median of 2): span 1.5 ms, GPU busy 0.5 ms" in trace.table(s)


def test_decode_steps_give_a_steps_cost_by_kind() -> None:
    events = [_k("cutlass_3x_sm90_gemm", 0, 60), _k("flash_fwd_kernel", 60, 20),
              _k("cutlass_3x_sm90_gemm", 100, 60), _k("flash_fwd_kernel", 160, 20)]
    events += [{"ph": "X", "cat": "gpu_user_annotation", "ts": t, "dur": 100,
                "name": "execute_context_0(0)_generation_64(64)"} for t in (0, 100)]
    # a step with prompt tokens in it is not a decode step
    events.append({"ph": "X", "cat": "gpu_user_annotation", "ts": 200, "dur": 50,
                   "name": "execute_context_1(512)_generation_63(63)"})
    s = trace.summarize(events)
    assert s["decode_steps"] == 2 and s["decode_step_ms"] == 0.1
    assert s["per_decode_step_ms"] == {"gemm": 0.06, "attention": 0.02}
    assert s["gpu_busy_per_decode_step_ms"] == 0.08
    assert s["decode_step_period_ms"] == 0.1
    assert "2 decode steps of 0.1 ms, one every 0.1 ms" in trace.table(s)
    assert "decode_steps" not in trace.summarize(EVENTS)
    # the GPU waiting for the host between steps: each step's own time stays, the period grows
    late = [{**e, "ts": e["ts"] + 50} if e["ts"] >= 100 else e for e in events]
    s = trace.summarize(late)
    assert (s["decode_step_ms"], s["decode_step_period_ms"]) == (0.1, 0.15)


def test_fa3_is_attention_and_a_cut_name_keeps_its_whole_text() -> None:
    fa3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
           "flash::CollectiveMainloopFwdSm90<2, cute::tuple<int, int>, 128>>>>(Params)")
    gemm = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<cute::C<64>, "
            "cute::C<64>, cute::C<256>>, cutlass_3x_sm90_tensorop_e4m3>>(Params)")
    assert trace.kind_of(fa3) == "attention" and trace.kind_of(gemm) == "gemm"
    s = trace.summarize([_k(fa3, 0, 50), _k(gemm, 50, 20), _k("rms_norm_kernel", 70, 5)])
    top = {k["kind"]: k for k in s["top_kernels"]}
    assert top["gemm"]["full_name"] == gemm and "C<256>" in top["gemm"]["full_name"]
    assert top["attention"]["name"].endswith("<...>") and "full_name" not in top["norm"]



def test_prompt_steps_list_the_steps_around_a_prompt_read_beside_decoding_streams() -> None:
    """A first token sent while other streams decode
    (docs/decisions.md#the-first-token-before-the-next-steps-launch-h100): the trace lists the
    steps around the one that reads the prompt, each with its GPU span, the GPU idle before it and
    the host's time launching it, so the ms between send and first token can be placed."""
    def step(name: str, ts: float, dur: float, cat: str = "gpu_user_annotation") -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    dec = "execute_context_0(0)_generation_1(4)"
    mixed = "execute_context_1(512)_generation_1(4)"
    short = "execute_context_1(64)_generation_1(4)"  # a prompt shorter than the probe's
    events = [step(dec, 0, 20_000), step(dec, 21_000, 20_000), step(mixed, 45_000, 75_000),
              step(dec, 125_000, 20_000), step(short, 146_000, 10_000),
              step(dec, 45_000 - 30_000, 2_000, "user_annotation"),   # host: an older decode
              step(mixed, 44_000, 3_000, "user_annotation"),          # host: launched the prompt
              step(dec, 118_000, 1_500, "user_annotation"),
              _k("cutlass_3x_sm90_gemm", 45_000, 70_000)]
    (p,) = trace.prompt_steps(events, 512, before=2, after=1)
    assert p["prompt_tokens"] == 512 and p["gpu_ms"] == 75.0
    assert [s["at_ms"] for s in p["steps"]] == [-45.0, -24.0, 0.0, 80.0]
    assert [s["idle_before_ms"] for s in p["steps"]] == [None, 1.0, 4.0, 5.0]
    assert [s["this"] for s in p["steps"]] == [False, False, True, False]
    this, after = p["steps"][2], p["steps"][3]
    assert (this["host_ms"], this["prompts"], this["decoding"], this["decode_tokens"]) == (3.0, 1, 1, 4)
    assert after["host_ms"] == 1.5 and p["steps"][0]["host_ms"] is None  # none began before it
    lines = trace.prompt_steps_table([p])
    assert lines[0] == "prompt step 1 (512 prompt tokens): GPU 75.0 ms"
    assert lines[3].startswith("  > at     0.000 ms  GPU   75.000 ms")
    # a trace with no step that long: nothing listed
    assert trace.prompt_steps(events, 1024) == []


def test_prompt_passes_say_whether_the_gpu_waits_on_the_host() -> None:
    """A prefix-cache hit left the h100 image a 336-token pass whose FP8 GEMMs
    finished
    before the host had issued the next layer; a fresh 1024-token pass kept the GPU busier than
    the host. Each probe's pass: its GPU span, the busy time inside that span only, the host's
    time issuing it and its median attention op."""
    def ann(name: str, ts: float, dur: float, cat: str = "gpu_user_annotation") -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    def attn(ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": trace.ATTENTION_OP, "ts": ts, "dur": dur}

    hit, fresh = "execute_context_1(336)_generation_0(0)", "execute_context_1(1024)_generation_0(0)"
    events = [
        ann(hit, 1_000, 14_000, "user_annotation"), ann(hit, 1_500, 14_000),
        _k("nvjet_sm90_qqtst_256x112", 1_500, 4_000), _k("nvjet_sm90_qqtst_256x112", 9_000, 4_000),
        _k("triton_draft_pass", 15_000, 2_000),  # runs past the pass: only 500 us of it counts
        attn(2_000, 150), attn(3_000, 250), attn(4_000, 200),
        attn(40_000, 900),  # outside any host pass
        ann(fresh, 50_000, 10_000, "user_annotation"), ann(fresh, 50_500, 16_000),
        _k("nvjet_sm90_qqtst_128x128", 50_500, 15_000),
        ann("execute_context_0(0)_generation_0(0)", 70_000, 300, "user_annotation"),
        ann("execute_context_0(0)_generation_0(0)", 70_100, 200),
        # a prompt read beside a decoding stream is not a probe's pass
        ann("execute_context_1(400)_generation_1(4)", 80_000, 5_000),
    ]
    hit_pass, fresh_pass = trace.prompt_passes(events, 300)
    assert hit_pass == {"prompt_tokens": 336, "gpu_ms": 14.0, "busy_ms": 8.5, "host_ms": 14.0,
                        "attention_host_us": 200.0}
    assert fresh_pass == {"prompt_tokens": 1024, "gpu_ms": 16.0, "busy_ms": 15.0, "host_ms": 10.0,
                          "attention_host_us": None}
    assert trace.prompt_passes(events, 1024) == [fresh_pass]
    waits = trace.median_pass([hit_pass])
    assert waits["host_bound"] and waits["passes"] == 1
    ahead = trace.median_pass([fresh_pass])
    assert not ahead["host_bound"] and trace.median_pass([]) == {}
    line = trace.table({**trace.summarize(events), "prompt_pass": waits}).splitlines()[-1]
    assert line == ("prompt pass (median of 1): 336 tokens, GPU 14.0 ms with 8.5 ms busy, host "
                    "14.0 ms to issue it, vLLM's attention op 200.0 us a layer: the GPU waits on "
                    "the host")
    assert trace.table({**trace.summarize(events), "prompt_pass": ahead}).endswith(
        "host 10.0 ms to issue it: the host runs ahead")
