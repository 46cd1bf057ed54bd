"""inference-image verify: target parsing, the one-line errors before any test runs, the summary."""

import http.server
import json
import os
import shutil
import subprocess

import pytest
from conftest import first_boot, machine, runtime

from inference_image.cli import main
from inference_image.ops.verify import (
    PATHS,
    PUBLIC_HEALTH,
    VerifyError,
    parse_target,
    summarize,
    wait_ready,
)


def test_parse_target():
    t = parse_target("203.0.113.7", "root")
    assert (t.kind, t.host, t.port) == ("ssh", "203.0.113.7", 22)
    assert parse_target("vm:2222", "ubuntu").port == 2222
    assert parse_target("vm:2222", "ubuntu").testinfra_url("/k") == "paramiko://ubuntu@vm:2222?ssh_identity_file=/k"
    assert parse_target("podman://box", "root").testinfra_url(None) == "podman://box"
    assert parse_target("local://", "root").kind == "local"
    with pytest.raises(VerifyError, match="port must be a number"):
        parse_target("vm:ssh", "root")


def one_error_line(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_unknown_tier(capsys):
    assert "h900" in one_error_line(capsys, ["verify", "--host", "x", "--profile", "h900"])


def test_unreachable_host(capsys):
    line = one_error_line(capsys, ["verify", "--host", "127.0.0.1:1", "--profile", "cpu"])
    assert line.startswith("verify: cannot reach 127.0.0.1:1 over SSH")


def test_unknown_host(capsys):
    line = one_error_line(capsys, ["verify", "--host", "no-such-host.invalid", "--profile", "cpu"])
    assert "no such host" in line


def test_missing_identity(capsys):
    line = one_error_line(capsys, ["verify", "--host", "x", "--profile", "cpu", "--identity", "/nope"])
    assert "--identity /nope: no such file" in line


def test_this_machine_is_not_an_image(capsys):
    line = one_error_line(capsys, ["verify", "--host", "local://", "--profile", "cpu"])
    assert "not an inference-image build" in line


@pytest.mark.skipif(not shutil.which("podman"), reason="podman is not installed")
def test_missing_container(capsys):
    line = one_error_line(capsys, ["verify", "--host", "podman://no-such-box", "--profile", "cpu"])
    assert "no running container named no-such-box" in line


def test_summary_table(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text("""<testsuites><testsuite>
<testcase classname="test_smoke" name="test_a"/>
<testcase classname="test_smoke" name="test_b"><failure message="router down&#10;more"/></testcase>
<testcase classname="test_gpu" name="test_c"><skipped message="tier cpu has no GPU"/></testcase>
</testsuite></testsuites>""")
    table, ok = summarize(junit)
    assert not ok
    lines = table.splitlines()
    assert lines[0].split() == ["SUITE", "PASSED", "FAILED", "SKIPPED", "NOTE"]
    assert lines[1].split()[:4] == ["smoke", "1", "1", "0"]
    assert lines[2].split()[:4] == ["gpu", "0", "0", "1"] and "tier cpu has no GPU" in lines[2]
    assert "smoke::test_b: router down" in table
    junit.write_text('<testsuite><testcase classname="test_gpu" name="t"><skipped message="x"/>'
                     '</testcase></testsuite>')
    assert summarize(junit)[1] is False  # nothing passed is not a pass


def test_the_summary_names_what_was_not_judged_here(tmp_path):
    """A machine without the DCGM exporter's unit (the lab) has its GPU metrics and DCGM rules
    left out by the security suite, which records why: the table says so, and it is no failure."""
    junit = tmp_path / "j.xml"
    why = "/metrics/gpu and the DCGM alert rules: no nvidia-dcgm-exporter.service on this machine"
    junit.write_text(f"""<testsuites><testsuite><properties>
<property name="not_judged" value="{why}"/>
</properties><testcase classname="test_security" name="test_a"/></testsuite></testsuites>""")
    table, ok = summarize(junit)
    assert ok
    assert table.splitlines()[-2:] == ["not judged here:", "  /metrics/gpu and the DCGM alert rules: "
                                       "no nvidia-dcgm-exporter.service on this machine"]


def test_a_down_exporter_is_its_own_503_not_the_models() -> None:
    from inference_image.profiles import resolve
    from inference_image.render import files
    conf = files(resolve("h100"))["etc/nginx/conf.d/inference-image.conf"][0]
    gpu = conf[conf.index("location = /metrics/gpu {"):]
    assert "error_page 502 504 = @metrics_unavailable_gpu;" in gpu.split("}")[1]
    assert "return 503 'GPU metrics unavailable: its exporter (dcgm, port 9400) is not " \
           "answering\\n';" in conf
    assert "the model is not serving" not in gpu.split("location @metrics_unavailable_gpu")[0]


def fake_systemctl(tmp_path, monkeypatch, states: list[str]) -> None:
    """A `systemctl` on PATH that answers is-system-running with the next of `states`."""
    (tmp_path / "states").write_text("\n".join(states) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "systemctl"
    tool.write_text(f"""#!/bin/sh
s=$(head -1 {tmp_path}/states); sed -i 1d {tmp_path}/states; [ -n "$s" ] || s=starting
echo "$s"
""")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_wait_without_serving_waits_for_the_boot_to_finish(tmp_path, monkeypatch):
    # the machine is still going down, then booting, then up with a failed unit (no GPU)
    fake_systemctl(tmp_path, monkeypatch, ["stopping", "starting", "starting", "degraded", "x"])
    wait_ready(parse_target("local://", "root"), None, 30, serving=False, interval=0.01)
    assert (tmp_path / "states").read_text() == "x\n"  # it stopped at the first finished boot


def test_wait_without_serving_gives_up_with_the_last_state(tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, [])
    with pytest.raises(VerifyError, match=r"did not finish booting within 0 s \(last: starting\)"):
        wait_ready(parse_target("local://", "root"), None, 0, serving=False, interval=0.01)


def test_wait_retries_the_first_connection(monkeypatch):
    import inference_image.ops.verify as v

    answers = [VerifyError("SSH to h:22 failed: No existing session"), "cpu"]

    def fake(t, identity):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a
    monkeypatch.setattr(v, "preflight", fake)
    assert v.preflight_until(parse_target("h", "root"), None, 5, interval=0.01) == "cpu"
    answers[:] = [VerifyError("refused")] * 3
    with pytest.raises(VerifyError, match="refused"):
        v.preflight_until(parse_target("h", "root"), None, 0, interval=0.01)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *_):
        pass


def test_public_health_probe_checks_the_machines_certificate(tmp_path):
    """verify --wait's probe, run as on a machine: TLS against the certificate first boot made,
    and a refusal when the server shows another certificate."""
    m = machine(tmp_path, Health)
    assert PUBLIC_HEALTH.split()[:2] == [PATHS["startup"], "public-health"]
    # endpoint.json as first boot wrote it (the machine's own paths, found under INFERENCE_ROOT)
    ep = json.loads((m.etc / "endpoint.json").read_text())
    (m.etc / "endpoint.json").write_text(json.dumps({**ep, "tls_cert": PATHS["tls_cert"]}))

    def probe() -> str:
        return subprocess.run([*runtime("inference-startup"), *PUBLIC_HEALTH.split()[1:]],
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, "INFERENCE_ROOT": str(m.root)}).stdout.strip()
    with m.serving():
        assert probe() == "200"
    first_boot(tmp_path / "render", tmp_path / "other")
    with m.serving(tmp_path / "other/etc/inference-image/tls"):
        assert "CERTIFICATE_VERIFY_FAILED" in probe()
