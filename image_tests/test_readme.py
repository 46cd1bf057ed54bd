"""readme: the README's requests, run on the machine as a user runs them (the curl command and the
OpenAI client, with the machine's certificate and key as cert.pem and api-key): a snippet that
does not run against the image is not shipped. Only the address changes, to the machine's own."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest
from conftest import Public

from inference_image.profiles import project_root

README_URL = "https://127.0.0.1:8443"  # what `make boot` forwards the VM's public port to
WORK = "/var/tmp/inference-image-readme"


def snippet(lang: str, marker: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", (project_root() / "README.md").read_text(), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"the README has {len(found)} {lang} blocks with {marker!r}"
    return found[0]


@pytest.fixture
def workdir(root: Any, profile: dict[str, Any], public: Public) -> Any:
    if not public.tls:
        pytest.skip("the README's requests check the machine's certificate; this one serves plain HTTP")
    paths = profile["paths"]
    root.run(f"rm -rf {WORK} && mkdir -p {WORK} && cp {paths['tls_cert']} {WORK}/cert.pem && "
             f"cp {paths['api_key']} {WORK}/api-key")
    yield WORK
    root.run(f"rm -rf {WORK}")


def as_here(code: str, profile: dict[str, Any], public: Public) -> str:
    assert README_URL in code and '"tiny-llama"' in code
    return code.replace(README_URL, public.url()).replace(
        '"tiny-llama"', json.dumps(profile["served_model_name"]))


@pytest.mark.serving
def test_the_readme_curl_request(root: Any, profile: dict[str, Any], public: Public,
                                 workdir: str) -> None:
    code = as_here(snippet("sh", "curl --cacert cert.pem"), profile, public)
    out = root.run(f"cd {workdir} && bash -euo pipefail -c {shlex.quote(code)}")
    assert out.rc == 0, out.stderr[-500:]
    answer = json.loads(out.stdout)
    assert isinstance(answer["choices"][0]["message"]["content"], str), answer


@pytest.mark.serving
def test_the_readme_openai_client(root: Any, profile: dict[str, Any], public: Public,
                                  workdir: str) -> None:
    code = as_here(snippet("python", "openai.OpenAI("), profile, public)
    python = f"{profile['paths']['vllm_venv']}/bin/python"  # has the openai client (vLLM needs it)
    out = root.run(f"cd {workdir} && {python} -c {shlex.quote(code)}")
    assert out.rc == 0, out.stderr[-800:]
    assert out.stdout.endswith("\n"), "the client printed no answer"
