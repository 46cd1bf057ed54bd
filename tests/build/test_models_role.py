"""The models role's check of each installed model against the catalog the render sized the image
by: the filter on its own, and the role's tasks run by Ansible on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from inference_image import render
from inference_image.profiles import resolve

ROOT = Path(__file__).resolve().parents[2]
FILTER = ROOT / "roles" / "models" / "filter_plugins" / "model_shape.py"

# The 70B's EAGLE-3 head as its checkpoint writes it (LlamaForCausalLMEagle3: no head_dim), and
# the 70B head SpecForge's config describes, which is 8192 wide with the target's 64 heads.
HEAD = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 6144,
        "num_attention_heads": 48, "num_key_value_heads": 8, "num_hidden_layers": 1,
        "vocab_size": 128256, "draft_vocab_size": 32000}
OTHER_HEAD = {**HEAD, "hidden_size": 8192, "num_attention_heads": 64}


def shape_filter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_shape", FILTER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def head_entry() -> dict[str, Any]:
    entry = render.models_list(resolve("h200"))[1]
    assert entry["name"] == "llama-3.3-70b-eagle3"
    return entry


def test_the_render_gives_each_model_the_shapes_it_sized_the_image_by() -> None:
    target, head = render.models_list(resolve("h200"))
    assert target["shape"] == {"num_hidden_layers": 80, "hidden_size": 8192,
                               "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128}
    assert head["shape"]["num_attention_heads"] == 48


def test_the_filter_names_each_field_the_checkpoint_disagrees_with() -> None:
    mismatches = shape_filter().model_shape_mismatches
    shape = head_entry()["shape"]
    assert mismatches(HEAD, shape) == []  # head_dim from hidden size over heads: 6144 / 48
    assert mismatches(OTHER_HEAD, shape) == ["hidden_size 8192 (the catalog: 6144)",
                                              "num_attention_heads 64 (the catalog: 48)"]
    # the speculators format nests the layer's fields
    assert mismatches({"transformer_layer_config": OTHER_HEAD}, shape)[1].startswith(
        "num_attention_heads 64")
    no_kv = {k: v for k, v in HEAD.items() if k != "num_key_value_heads"}
    assert mismatches(no_kv, shape) == ["num_key_value_heads missing (the catalog: 8)"]


def run_check(tmp_path: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    entry = {**head_entry(), "path": str(tmp_path / "model")}
    Path(entry["path"]).mkdir()
    (Path(entry["path"]) / "config.json").write_text(json.dumps(config))
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": [{"ansible.builtin.include_role": {"name": "models",
                                                         "tasks_from": "check_shapes"},
                        "vars": {"models_list": [entry]}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
    playbook = Path(sys.executable).parent / "ansible-playbook"
    # this Python for the modules too: interpreter discovery may find one without Ansible's deps
    return subprocess.run([str(playbook), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_the_role_passes_a_checkpoint_of_the_catalogs_shapes(tmp_path: Path) -> None:
    proc = run_check(tmp_path, HEAD)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_role_stops_the_build_on_a_checkpoint_of_other_shapes(tmp_path: Path) -> None:
    proc = run_check(tmp_path, OTHER_HEAD)
    assert proc.returncode != 0
    said = " ".join(proc.stdout.split())
    assert ("models: llama-3.3-70b-eagle3 (yuhuili/EAGLE3-LLaMA3.3-Instruct-70B@main) has "
            "hidden_size 8192 (the catalog: 6144), num_attention_heads 64 (the catalog: 48) "
            "in its config.json") in said
    assert "Fix: correct llama-3.3-70b-eagle3 in profiles/_catalog.yaml" in said
    assert "Traceback" not in proc.stdout + proc.stderr
