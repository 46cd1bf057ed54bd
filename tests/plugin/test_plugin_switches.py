"""The plugin's switches are one list (inference_image_vllm.switches): the render writes no name
the plugin does not read, and the plugin reads none the render cannot write."""

from __future__ import annotations

import importlib.util
import re

from conftest import ROOT

from inference_image.profiles import resolve
from inference_image.render import vllm_env


def switches() -> object:
    path = ROOT / "plugins/vllm/inference_image_vllm/switches.py"
    spec = importlib.util.spec_from_file_location("switches", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_render_writes_exactly_the_switches_the_plugin_reads() -> None:
    sw = switches()
    rendered = set(sw.RENDERED)  # type: ignore[attr-defined]
    text = (ROOT / "src/inference_image/render.py").read_text()
    # the render spells none of the names: it writes the plugin's own (switches.NAME)
    assert re.findall(r"INFERENCE_IMAGE_[A-Z0-9_]+", text) == []
    in_render = {getattr(sw, n) for n in re.findall(r"switches\.([A-Z0-9_]+)", text)}
    assert in_render == rendered, in_render ^ rendered
    # a name in quotes is one the code reads (docstrings name them in prose)
    in_plugin = set(re.findall(r"[\"']INFERENCE_IMAGE_[A-Z0-9_]+[\"']", "".join(
        p.read_text() for p in (ROOT / "plugins/vllm/inference_image_vllm").glob("*.py")
        if p.name != "switches.py")))
    assert in_plugin == set(), f"the plugin names these outside switches.py: {in_plugin}"
    # and a tier that turns them on gets them in its unit's environment
    r = resolve("h100")
    env = vllm_env(r, r.instances[0])
    assert {k for k in env if k.startswith("INFERENCE_IMAGE_")} <= rendered
    assert sw.FP8_DISPATCH in env  # type: ignore[attr-defined]


def test_the_checkpoint_gates_names_are_the_machines() -> None:
    """The plugin's gate reads the two variables the machine's runtime gives a start whose helper
    holds its gate: the same names as the machine's contract (the plugin cannot import it)."""
    from inference_image_vllm import switches
    from inference_machine.contract import ENV
    assert (ENV.checkpoint_token, ENV.checkpoint_gate) == \
        (switches.CHECKPOINT_TOKEN, switches.CHECKPOINT_GATE)
    # and the helper speaks to the gate by the gate's header and its count's path
    from inference_image_vllm import gate
    from inference_machine import checkpoint
    assert (checkpoint.GATE_HEADER.lower().encode(), checkpoint.GATE_STATE) == \
        (gate.HEADER, gate.STATE_PATH)
