"""The second round of hostile inputs, by class, beside the corpus (test_hostile_corpus):
each is refused in one line, bounded, or harmless; none hangs or raises a traceback."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

import inference_machine as st
from inference_image.ops import fleet
from inference_lab import standin_weights
from inference_machine import bundle, fleetfile, inputs

anatomy = importlib.import_module("inference_machine.anatomy")  # the package exports a
# function of the same name
STARTUP = [sys.executable, "-m", "inference_machine.cli"]


def _key() -> dict[str, str]:
    return {f: "x" for f in st.KEY_FIELDS}


def _bundle(tmp_path: Path) -> Path:
    cache = tmp_path / "made"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "k.bin").write_bytes(os.urandom(300_000))  # does not compress away
    out = tmp_path / "b.tar.gz"
    bundle.make(cache, out, _key())
    return out


def test_a_bundle_cut_short_is_refused_by_show_before_any_machine_gets_it(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    assert "each start uses it" in bundle.describe(b)
    data = b.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(bundle.BundleError, match=r"not a readable tar.gz|cut short"):
        bundle.describe(cut)


def test_make_without_the_units_model_path_says_so_and_writes_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DRAFT_PATH")}
    r = subprocess.run([*STARTUP, "make", "--cache", str(tmp_path), "--out",
                        str(tmp_path / "b.tar.gz")], capture_output=True, text=True, env=env,
                       timeout=60, check=False)
    assert r.returncode == 1 and "MODEL_PATH is not set" in r.stderr
    assert not (tmp_path / "b.tar.gz").exists()


@pytest.mark.parametrize("port", ["abc", "0", "65536", "1e3", "-1", "\uff18\uff10"])
def test_notify_refuses_what_is_not_a_port_at_once(port: str) -> None:
    t0 = time.monotonic()
    r = subprocess.run([*STARTUP, "notify", port, "--pid", "1"], capture_output=True, text=True,
                       timeout=30, check=False, env={**os.environ, "NOTIFY_SOCKET": "/x"})
    assert r.returncode == 2 and "is not a port" in r.stderr and time.monotonic() - t0 < 20


@pytest.mark.parametrize("text", ["[" * 100 + "]" * 100, '{"a": NaN}', '{"a": Infinity}',
                                  '{"a": -Infinity}', "1" * 200, '{"a": 1e999}'])
def test_one_json_reader_refuses_deep_nesting_nan_infinity_and_huge_numbers(
        text: str, tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(text)
    with pytest.raises(inputs.InputError):
        inputs.read_json(p, "record", 1 << 20)


def test_the_json_reader_refuses_a_fifo_and_a_device_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.json")
    (tmp_path / "z.json").symlink_to("/dev/zero")
    for name in ("f.json", "z.json"):
        with pytest.raises(inputs.InputError, match="not a regular file"):
            inputs.read_json(tmp_path / name, "record", 1 << 20)


def test_a_cache_manifest_nested_deeply_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / bundle.MANIFEST).write_text("[" * 5000 + "]" * 5000)
    state, line = bundle.check(cache, _key())
    assert state == "corrupt" and "nested" in line


def test_the_endpoint_record_never_waits_on_a_fifo(tmp_path: Path) -> None:
    endpoint = tmp_path / "endpoint.json"
    os.mkfifo(endpoint)
    done = threading.Event()

    def record() -> None:
        anatomy.record_ready(endpoint, "vllm-0", {"s": 1.0})
        done.set()

    threading.Thread(target=record, daemon=True).start()
    assert done.wait(10), "record_ready waited on a FIFO"
    assert json.loads(endpoint.read_text())["ready"]["vllm-0"] == {"s": 1.0}


def test_a_starts_long_journal_lines_are_read_in_bounded_time() -> None:
    line = "[  12.345678] host vllm[1]: " + "x" * 500_000
    t0 = time.monotonic()
    got = anatomy.journal_lines("\n".join([line] * 300), 0.0)
    assert time.monotonic() - t0 < 5 and all(len(m) <= anatomy.MAX_LINE for _, m in got)


@pytest.mark.parametrize("router", ["169.254.169.254", "0.0.0.0", "8.8.8.8", "224.0.0.1",
                                    "255.255.255.255"])
def test_a_worker_never_joins_a_router_outside_its_network(router: str, tmp_path: Path) -> None:
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps({"role": "worker", "router": f"http://{router}:8000",
                             "instance_ports": [8100]}))
    with pytest.raises(fleetfile.FleetFileError, match="'router' is"):
        fleetfile.role_line(f, "join", 1)
    assert fleetfile.private_ipv4("10.1.2.3") and fleetfile.private_ipv4("169.254.169.254") is None


@pytest.mark.parametrize("nets", [["0.0.0.0/0"], ["::/0"], ["8.0.0.0/5"]])
def test_scrape_from_never_opens_the_workers_port_to_everyone(nets: list[str]) -> None:
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="would open the workers' public port"):
        fleet.FleetSpec.model_validate({"name": "f1", "tier": "cpu", "workers": 1,
                                        "snapshot": "123", "scrape_from": nets})


def test_the_plan_says_what_scrape_from_opens() -> None:
    spec = fleet.FleetSpec.model_validate({"name": "f1", "tier": "cpu", "workers": 1,
                                           "snapshot": "123", "scrape_from": ["203.0.113.0/24"]})
    text = fleet.describe(fleet.plan(spec))
    assert "(the workers' public port) from 203.0.113.0/24 (scrape_from" in text


def test_stand_in_weights_never_replace_a_folder_they_did_not_write(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "mine.safetensors").write_text("a user's weights")
    with pytest.raises(standin_weights.StandinError, match="did not write"):
        standin_weights.write(src, dest)
    assert (dest / "mine.safetensors").read_text() == "a user's weights"


def test_the_bundle_check_of_a_tar_is_unaffected(tmp_path: Path) -> None:
    """The reader changes leave a good bundle installable and checked as before."""
    b = _bundle(tmp_path)
    cache = tmp_path / "cache"
    bundle.install(b, cache)
    assert bundle.check(cache, _key())[0] == "bundle"
    with tarfile.open(b) as tar:
        assert tar.getnames()[0] == bundle.MANIFEST


def test_a_model_folder_whose_links_loop_is_read_ahead_once(tmp_path: Path) -> None:
    """Two links of a model folder to each other (or to the folder) end the read-ahead's walk
    there, in bounded time, instead of looping for good."""
    from inference_machine import prepare
    m = tmp_path / "model"
    (m / "sub").mkdir(parents=True)
    (m / "config.json").write_text("{}")
    (m / "sub" / "w.bin").write_bytes(b"w" * 10)
    (m / "self").symlink_to(m)
    (m / "sub" / "up").symlink_to(m)
    (m / "a").symlink_to(m / "b")
    (m / "b").symlink_to(m / "a")
    t0 = time.monotonic()
    files = prepare.model_files(m)
    assert time.monotonic() - t0 < 5
    assert sorted(f.name for f in files) == ["a", "b", "config.json", "w.bin"]
    n, total = prepare.prefetch(None, [m])
    assert n == 4 and total == 12


@pytest.mark.parametrize("doc", [{"router": [1]}, {"router": {"internal_port": "abc"}},
                                 {"instances": "x"}, {"paths": {"endpoint": 7}}, {"tier": ["a"]},
                                 {"instances": [1], "paths": []}])
def test_the_banner_on_a_profile_json_edited_by_hand_is_no_traceback(tmp_path: Path,
                                                                    doc: dict) -> None:
    etc = tmp_path / "etc" / "inference-image"
    etc.mkdir(parents=True)
    (etc / "profile.json").write_text(json.dumps({"profile": {}, **doc}))
    r = subprocess.run([*STARTUP, "motd"], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "INFERENCE_ROOT": str(tmp_path)}, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
