"""A value from a profile or the catalog is data wherever the render writes it. Hostile
strings go into every string field of the schema, one at a time: either validation refuses the
value with a ProfileErrors (field, why, fix), or every rendered file still parses in its own
language and carries the value only as data (quoted JSON, an !unsafe YAML string, an escaped HCL
string) and never where a shell, nginx, systemd or Ansible would read it as syntax."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from inference_image.profiles import ProfileErrors, resolve
from inference_image.render import files, unsafe_yaml
from inference_image.schema import CatalogModel, Profile

# what the hostile-input review reproduced, then what the generator adds
CORPUS = ["::%$(id>PWNED)", "::%x\nlisten 80;", "main\n{{ lookup('pipe','id') }}", "--local-dir=/etc",
          "/tmp/evil.py", "../../..", "${HF_TOKEN}", "#x", "--host 0.0.0.0", "$(touch /tmp/pwn)",
          "`id`", "a'b\"c", "x;y", "{{ 7*7 }}", "%{ if true }x%{ endif }", "${var.tier}",
          "a\\", "}", "x\r\ny", "\x00", "-", "--trust_remote_code", "--ho"]
HOSTILE = st.one_of(st.sampled_from(CORPUS), st.text(
    alphabet=st.sampled_from(list("ab09-_./:%$(){}[];&|<>`'\"\\\n\r\t #!*?~=@,+^")), max_size=24))
SHELL_SAFE = re.compile(r"^[A-Za-z0-9._/:@%+=,-]*$")


def string_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field of `model` (nested models walked) whose type admits a str."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        args = typing.get_args(ann) if isinstance(ann, types.UnionType) or typing.get_origin(
            ann) is typing.Union else (ann,)
        for a in args:
            origin = typing.get_origin(a)
            if isinstance(a, type) and issubclass(a, BaseModel):
                out += string_fields(a, f"{prefix}{name}.")
            elif origin is list:
                if typing.get_args(a) and typing.get_args(a)[0] is str:
                    out.append(f"{prefix}{name}[]")
                break
            elif origin is dict:
                break
            elif a is str or "str" in str(a) or "IPv" in str(a) or "Literal" in str(a):
                out.append(f"{prefix}{name}")
                break
    return out


PROFILE_FIELDS = string_fields(Profile)
CATALOG_FIELDS = [f"catalog.{f}" for f in string_fields(CatalogModel)]


def test_the_fields_attacked_are_every_string_field() -> None:
    for f in ("description", "hardware.gpu_model", "router.bind", "serving.extra_args[]",
              "model.target", "digitalocean.base_image", "versions.vllm"):
        assert f in PROFILE_FIELDS
    for f in ("revision", "local_config", "hub_id", "acceptance_source"):
        assert f"catalog.{f}" in CATALOG_FIELDS


@pytest.fixture(scope="module")
def pdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("profiles")
    shutil.copytree(ROOT / "profiles", d, dirs_exist_ok=True)
    return d


def rendered(pdir: Path, tier: str, field: str, value: str) -> dict[str, str] | None:
    """The render's files with `value` in `field`, or None where validation refused it."""
    catalog_file = pdir / "_catalog.yaml"
    shipped = catalog_file.read_text()
    overrides = []
    try:
        if field.startswith("catalog."):
            cat = yaml.safe_load(shipped)
            target = resolve(tier, pdir).profile.model.target
            cat["models"][target][field.removeprefix("catalog.")] = value
            catalog_file.write_text(yaml.safe_dump(cat, allow_unicode=True))
        elif field.endswith("[]"):
            overrides = [f"{field[:-2]}={json.dumps([value])}"]
        else:
            overrides = [f"{field}={json.dumps(value)}"]
        try:
            r = resolve(tier, pdir, overrides)
        except ProfileErrors as exc:
            assert str(exc).strip(), "a refusal must say what is wrong"
            return None
        return {path: text for path, (text, _) in files(r).items()}
    finally:
        catalog_file.write_text(shipped)


class _Tagged(yaml.SafeLoader):
    pass


_Tagged.add_constructor("!unsafe", lambda loader, node: ("UNSAFE", loader.construct_scalar(node)))


def untagged_strings(node: Any) -> list[str]:
    """Strings Ansible would template: a template's opening, not tagged !unsafe."""
    if isinstance(node, str):
        return [node] if any(o in node for o in ("{{", "{%", "{#")) else []
    if isinstance(node, tuple):  # ("UNSAFE", value)
        return []
    if isinstance(node, dict):
        return [s for v in node.values() for s in untagged_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in untagged_strings(v)]
    return []


BASELINE: dict[str, dict[str, str]] = {}


def assert_data_only(out: dict[str, str], value: str, tier: str) -> None:
    """`out` parses file by file; outside the data formats (JSON, !unsafe YAML, escaped HCL) the
    value adds no occurrence of itself to any file the shipped render has (shells, nginx, units,
    cloud-init read it as syntax there)."""
    inert = bool(SHELL_SAFE.match(value))
    base = BASELINE.setdefault(tier, {p: t for p, (t, _) in files(resolve(tier)).items()})
    for path, text in out.items():
        if path.endswith(".json"):
            json.loads(text)
        elif path.endswith("extra-vars.yml"):
            doc = yaml.load(text, Loader=_Tagged)
            assert untagged_strings(doc) == [], f"{path}: strings Ansible would template"
        elif path.endswith(".pkrvars.hcl"):
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    m = re.fullmatch(r'(\w+)\s*=\s*(".*"|true|false|\d+)', line)
                    assert m, f"{path}: {line!r} is not one assignment"
                    if m[2].startswith('"'):
                        json.loads(m[2].replace("$${", "${").replace("%%{", "%{"))
                        assert not re.search(r"(?<!\$)\$\{|(?<!%)%\{", m[2]), line
        elif path.startswith("etc/update-motd.d/"):
            syntax = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True,
                                    check=False)
            assert syntax.returncode == 0, f"{path}: {syntax.stderr}"
        if path.endswith((".args", ".env")):
            # one argument / one variable a line, expanded by inference-run: no line may grow
            assert "\n" not in value or value not in text, f"{path}: a value split over lines"
            if path.endswith(".args") and value in text.splitlines():
                assert "${" not in value, f"{path}: inference-run would expand {value!r}"
        elif not inert and value and not path.endswith((".json", ".yml", ".pkrvars.hcl")):
            assert text.count(value) <= base.get(path, "").count(value), \
                f"{path} holds {value!r} where its language reads syntax"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tier=st.sampled_from(["cpu", "h100x8"]),
       field=st.sampled_from(PROFILE_FIELDS + CATALOG_FIELDS), value=HOSTILE)
def test_hostile_strings_in_any_string_field_are_refused_or_stay_data(
        pdir: Path, tier: str, field: str, value: str) -> None:
    out = rendered(pdir, tier, field, value)
    if out is not None:
        assert_data_only(out, value, tier)


@pytest.mark.parametrize(("field", "value"), [
    ("router.bind", "::%$(id>PWNED)"), ("router.bind", "::%x\nlisten 80;"),
    ("catalog.revision", "main\n{{ lookup('pipe','id') }}"), ("catalog.revision", "--local-dir=/etc"),
    ("catalog.local_config", "/tmp/evil.py"), ("catalog.local_config", "../../.."),
    ("serving.extra_args[]", "--api_key=x"), ("serving.extra_args[]", "--ho"),
    ("serving.extra_args[]", "--host 0.0.0.0"), ("serving.extra_args[]", "--trust-remote-code"),
    ("serving.extra_args[]", "--allowed-local-media-path"), ("serving.extra_args[]", "--config"),
    ("serving.extra_args[]", "#x"), ("serving.extra_args[]", "${HF_TOKEN}"),
    ("description", "x\x1b[2Jy"), ("hardware.gpu_model", "H100\n"),
])
def test_the_reviews_reproductions_are_refused(pdir: Path, field: str, value: str) -> None:
    tier = "h100x8" if field == "hardware.gpu_model" else "cpu"
    assert rendered(pdir, tier, field, value) is None


def test_a_harmless_value_still_renders_as_given(pdir: Path) -> None:
    out = rendered(pdir, "cpu", "serving.extra_args[]", "--enable-auto-tool-choice")
    assert out is not None and "--enable-auto-tool-choice" in out["etc/inference-image/units/vllm-0.args"]
    out = rendered(pdir, "cpu", "description", "cpu tier; $HOME stays text")
    assert out is not None
    assert json.loads(out["etc/inference-image/profile.json"])["profile"]["description"] == \
        "cpu tier; $HOME stays text"


class _AnsibleLike(yaml.SafeLoader):
    """Reads !unsafe as ansible-core 2.19 does: the scalar's type from its plain form."""


def _plain(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    tag = loader.resolve(yaml.ScalarNode, node.value, (True, False))
    return loader.construct_object(yaml.ScalarNode(tag, node.value))


_AnsibleLike.add_constructor("!unsafe", _plain)


@pytest.mark.parametrize("tier", ["cpu", "h100", "h200x8"])
def test_extra_vars_yaml_holds_the_json_values_with_their_types(tier: str) -> None:
    """"580" stays a string: ansible-core 2.19 reads an !unsafe scalar by its plain form again, so
    only strings that could be templates carry the tag (a driver branch of "580" became an int)."""
    out = {p: t for p, (t, _) in files(resolve(tier)).items()}
    doc = yaml.load(out["ansible/extra-vars.yml"], Loader=_AnsibleLike)
    assert doc == json.loads(out["ansible/extra-vars.json"])
    # and a value that could be a template is still tagged, so it stays a string
    hostile = {"x": "{{ 7*7 }}", "n": "580"}
    assert yaml.load(unsafe_yaml(hostile), Loader=_AnsibleLike) == hostile
