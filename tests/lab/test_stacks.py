"""The proof's stack sampler (standin/proof_stacks.py, started by the proof servers' sitecustomize)
and its summary (stacks.py), on real processes: a parent that works in one thread and waits in
another, and a child it forks, as vLLM's API server forks its engine core."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from inference_lab import proof, stacks

CHILD = textwrap.dedent("""
    import os, sys, threading, time

    def spin_parent(until):
        x = 0
        while time.monotonic() < until:
            x += 1

    def spin_child(until):
        x = 0
        while time.monotonic() < until:
            x += 1

    def idle(ev):
        ev.wait()

    ev = threading.Event()
    threading.Thread(target=idle, args=(ev,), name="idler", daemon=True).start()
    flag = os.path.join(os.environ["PROOF_STACKS_DIR"], "on")
    while not os.path.exists(flag):
        time.sleep(0.01)
    pid = os.fork()
    if pid == 0:
        spin_child(time.monotonic() + 1.0)
        while os.path.exists(flag):
            threading.Event().wait(0.01)  # a wait the summary must read as one
        time.sleep(0.5)  # its sampler writes once the flag is gone
        os._exit(0)
    spin_parent(time.monotonic() + 1.0)
    while os.path.exists(flag):
        threading.Event().wait(0.01)
    time.sleep(0.5)
    os.waitpid(pid, 0)
    ev.set()
""")


def sampled(tmp_path: Path, script: str, window_s: float) -> list[dict[str, Any]]:
    """`script` run as a proof server's process is (the proof's sitecustomize first), sampled for
    window_s as `proof step stacks` samples: what each process wrote."""
    folder = tmp_path / "stacks"
    folder.mkdir()
    env = {**os.environ, "PROOF_STACKS_DIR": str(folder),
           "PYTHONPATH": os.pathsep.join([str(proof.STANDIN), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    (folder / "on").touch()
    time.sleep(window_s)
    (folder / "on").unlink()
    assert proc.wait(20) == 0
    return stacks.load(folder)


# shares of a sampled second: another test's load on the same cores moves them
@pytest.mark.serial
def test_the_sampler_finds_where_each_process_works_and_waits(tmp_path: Path) -> None:
    docs = sampled(tmp_path, CHILD, 1.5)
    assert len(docs) == 2, [d.get("title") for d in docs]  # the parent's and the forked child's
    summary = stacks.summarize(docs)
    by_spinner = {}
    for proc_name, p in summary.items():
        main = p["threads"]["MainThread"]
        # the busy loop is the innermost frame most of the window, and it is work
        leaf = main["leaves"][0][0]
        by_spinner[stacks.function(leaf).rsplit(":", 1)[-1]] = main
        # about 1 s of spinning in a 1500 ms window, the rest a wait
        assert 0.4 < main["working"] < 0.95 and main["waiting"] > 0.05, (proc_name, main)
    assert set(by_spinner) == {"spin_parent", "spin_child"}
    # each process's main thread spun ~1 s of the window on the CPU; the idler used none
    for p in summary.values():
        assert 0.5 < p["cpu"]["main"] < 0.95 and len(p["cpu"]) == 1, p["cpu"]
    # the parent's other thread waited all along: left out as idle (working < 2 %)
    parent = next(p for p in summary.values()
                  if stacks.function(p["threads"]["MainThread"]["leaves"][0][0]).endswith(
                      "spin_parent"))
    assert "idler" not in parent["threads"]
    # only the parent has it (a forked child keeps only the thread that forked)
    (with_idler,) = [d for d in docs if any(t == "idler" for t, _, _ in d["stacks"])]
    idler = stacks.thread_summary(
        [(s.split(";"), n) for t, s, n in with_idler["stacks"] if t == "idler"], 100)
    assert idler["waiting"] > 0 and idler["working"] == 0
    assert "spin_parent" in stacks.table(summary)


GIL_BOUND = textwrap.dedent("""
    import os, threading, time

    def schedule(until):  # pure Python: holds the GIL
        x = 0
        while time.perf_counter() < until:
            x += 1

    def launch():  # lets go of the GIL, briefly
        time.sleep(0.0001)

    threading.Thread(target=threading.Event().wait, name="idler", daemon=True).start()
    flag = os.path.join(os.environ["PROOF_STACKS_DIR"], "on")
    while not os.path.exists(flag):
        time.sleep(0.01)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        schedule(time.perf_counter() + 0.004)
        launch()
    while os.path.exists(flag):
        time.sleep(0.01)
    time.sleep(0.5)
""")


# shares of a sampled second: another test's load on the same cores moves them
@pytest.mark.serial
def test_gil_bound_work_is_booked_where_it_runs_not_at_the_next_release(tmp_path: Path) -> None:
    # the engine core's loop: seconds of Python that holds the GIL, then a short call into C that
    # lets it go. A sampler thread only gets the GIL at that call and would book the Python there.
    docs = sampled(tmp_path, GIL_BOUND, 1.3)
    (main,) = [p["threads"]["MainThread"] for p in stacks.summarize(docs).values()]
    inclusive = dict(main["inclusive"])
    schedule = next(v for f, v in inclusive.items() if f.endswith(":schedule"))
    launch = next((v for f, v in inclusive.items() if f.endswith(":launch")), 0.0)
    # 1 s of the 1300 ms window in the loop, 4 ms of Python to a fraction of a ms asleep
    assert schedule > 0.6 and launch < 0.1, inclusive


def test_no_folder_no_sampler(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(proof.STANDIN),
                                                        os.environ.get("PYTHONPATH", "")])}
    env.pop("PROOF_STACKS_DIR", None)
    out = subprocess.run([sys.executable, "-c", "import threading; "
                          "print(sorted(t.name for t in threading.enumerate()))"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['MainThread']"


def test_children_say_what_a_function_spent_its_samples_on() -> None:
    a, b, c, w = "m.py:f:1", "m.py:g:2", "m.py:h:3", "threading.py:Condition.wait:355"
    s = stacks.thread_summary([([a, b], 6), ([a, c], 3), ([a, w], 1)], 10)
    assert s["working"] == 0.9 and s["waiting"] == 0.1
    assert s["children"]["m.py:f"] == [["m.py:g", 0.6], ["m.py:h", 0.3],
                                       ["threading.py:Condition.wait", 0.1]]
    assert s["inclusive"][0] == ["m.py:f", 1.0]


def test_engine_steps_from_vllms_metrics() -> None:
    text = "\n".join([
        "# TYPE vllm:iteration_tokens_total histogram",
        'vllm:iteration_tokens_total_bucket{engine="0",le="1.0"} 3.0',
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 412.0',
        'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 26368.0',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 26000.0',
        'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9'])
    assert proof.parse_engine_steps(text) == (412.0, 26000.0)
