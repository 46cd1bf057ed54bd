"""Each writer of configuration text (inference_machine.writers) fed the characters of its
syntax: it escapes them or refuses the value, and what it writes parses as the data it was given
(nginx -t where nginx is installed, nft --check where nft can run, openssl for a certificate's
names, CommonMark for the ledger's Markdown)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from inference_machine import writers
from inference_machine.inputs import (
    BearerToken,
    Email,
    Hostname,
    Port,
    Refused,
    TlsMode,
    fleet_network,
    listen_address,
)

# the characters each syntax reads as structure, and the ones that end or hide a line
SYNTAX = ['"', "'", ";", "{", "}", "$", "\\", " ", "\t", "\n", "\r", "\x00", "\x1b", "#", "~",
          ",", "|", "[", "]", "(", ")", "<", ">", "&", "*", "_", "`", "!", "\u2028", "\u202e",
          "\u200b", "\x85"]


@pytest.mark.parametrize("ch", [c for c in SYNTAX if c not in "~_"])  # RFC 6750 has ~ and _
def test_a_bearer_token_map_takes_no_character_of_nginx_syntax(ch: str) -> None:
    with pytest.raises(Refused, match="Fix:"):
        writers.nginx_bearer_map(f"abcdefgh{ch}ijklmnop")


def test_a_bearer_token_map_is_one_quoted_string() -> None:
    assert writers.nginx_bearer_map("abc.DEF-ghi_jkl~mno+p/q==") == '"Bearer abc.DEF-ghi_jkl~mno+p/q==" 1;\n'
    with pytest.raises(Refused, match="16 to 512"):
        writers.nginx_bearer_map("short")


def test_nginx_reads_the_map_as_one_key(tmp_path: Path) -> None:
    nginx = shutil.which("nginx", path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert nginx, "nginx is missing: make deps installs it"
    token = BearerToken.parse("0123456789abcdef0123456789abcdef")
    (tmp_path / "map").write_text(writers.nginx_bearer_map(token))
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/pid; error_log {tmp_path}/err;\nevents {{}}\nhttp {{ map $http_authorization"
        f" $ok {{ default 0; include {tmp_path}/map; }}\n server {{ listen 127.0.0.1:1; }} }}\n")
    r = subprocess.run([nginx, "-t", "-c", str(tmp_path / "nginx.conf")], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("text", ["0.0.0.0:8000", "[::]:8000", "127.0.0.1:1", "[2001:db8::1]:443"])
def test_a_listen_line_from_typed_values(text: str) -> None:
    address, port = writers.parse_listen(text)
    line = writers.nginx_listen(address, port, 4096, None)
    assert line == f"listen {text} backlog=4096;\n"


@pytest.mark.parametrize("text", ["0.0.0.0:8000;", "0.0.0.0:8000 ssl", "224.0.0.1:8000",
                                  "255.255.255.255:80", "[ff02::1]:80", "[fe80::1%eth0]:80",
                                  "0.0.0.0:99999", "0.0.0.0:0", "0.0.0.0", "1.2.3.4:8000\nlisten 80",
                                  "240.0.0.1:80", "0.0.0.0:\uff18\uff10"])
def test_a_listen_line_refuses_what_is_no_address_and_port(text: str) -> None:
    with pytest.raises(Refused):
        writers.parse_listen(text)


@pytest.mark.parametrize("path", ["/etc/x y.pem", "/etc/x;.pem", "/etc/x{.pem", "etc/x.pem",
                                  "/etc/$x.pem", "/etc/../x.pem", "/etc/x.pem\n"])
def test_a_listen_file_names_no_file_nginx_would_read_as_syntax(path: str) -> None:
    with pytest.raises(Refused):
        writers.nginx_listen(ipaddress.ip_address("0.0.0.0"), 8000, 4096, (path, "/etc/k.pem"))


@pytest.mark.parametrize("value", ["10.0.0.1", "10.110.0.0/20", "fd00::/48", "::1"])
def test_an_nft_element_is_the_address_as_ipaddress_writes_it(value: str) -> None:
    typed = ipaddress.ip_network(value) if "/" in value else ipaddress.ip_address(value)
    assert writers.nft_element(typed) == str(typed)


@pytest.mark.parametrize("value", ["10.0.0.1 }", "10.0.0.0/8, 0.0.0.0/0", "10.0.0.1\n"])
def test_an_nft_element_is_never_text(value: str) -> None:
    with pytest.raises(Refused):
        writers.nft_element(value)  # type: ignore[arg-type]


def test_subject_alt_names_take_typed_values_only() -> None:
    names = writers.subject_alt_names([Hostname.parse("llm.example.com")],
                                      [ipaddress.ip_address("10.0.0.7"),
                                       ipaddress.ip_address("2001:db8::7")])
    assert names == "DNS:llm.example.com,IP:10.0.0.7,IP:2001:db8::7"
    with pytest.raises(Refused):
        writers.subject_alt_names(["a.example,IP:1.2.3.4"], [])  # type: ignore[list-item]


@pytest.mark.parametrize("ch", SYNTAX)
def test_a_host_name_takes_no_character_of_any_syntax(ch: str) -> None:
    with pytest.raises(Refused, match="Fix:"):
        Hostname.parse(f"llm{ch}x.example.com")


@pytest.mark.parametrize(("text", "ok"), [
    ("llm.example.com", True), ("LLM.Example.COM\n", True), ("xn--bcher-kva.example", True),
    ("bücher.example", False), ("-a.example.com", False), ("a-.example.com", False),
    ("a..example.com", False), ("example", False), ("1.2.3.4", False), ("a" * 64 + ".com", False),
    (".".join(["a" * 60] * 5), False), ("a.example.com.", False), ("*.example.com", False)])
def test_a_domain_is_an_rfc_1123_name(text: str, ok: bool) -> None:
    if ok:
        assert Hostname.parse(text) == text.strip().lower()
    else:
        with pytest.raises(Refused):
            Hostname.parse(text)


@pytest.mark.parametrize(("text", "ok"), [
    ("ops@example.com", True), ("o.p+s@mail.example.com", True), ("ops@example", False),
    ("ops@@example.com", False), ("o..ps@example.com", False), ("ops @example.com", False),
    ('"o ps"@example.com', False), ("ops@example.com\nx", False), ("a" * 65 + "@example.com", False),
    ("ops@-example.com", False)])
def test_an_email_is_an_address(text: str, ok: bool) -> None:
    if ok:
        assert Email.parse(text) == text
    else:
        with pytest.raises(Refused):
            Email.parse(text)


@pytest.mark.parametrize(("value", "ok"), [
    (8000, True), ("8000", True), ("65535", True), (0, False), ("99999", False), (65536, False),
    ("", False), ("-1", False), ("1e3", False), ("\uff18\uff10", False), (True, False), (80.0, False),
    ("0x50", False), (" 80", False)])
def test_a_port_never_wraps(value: object, ok: bool) -> None:
    if ok:
        assert 0 < Port.parse(value) < 65536
    else:
        with pytest.raises(Refused):
            Port.parse(value)


@pytest.mark.parametrize(("text", "ok"), [
    ("10.110.0.0/20", True), ("172.16.0.0/16", True), ("192.168.1.0/24", True),
    ("fd12:3456:789a::/48", True), ("10.0.0.0/8", False), ("203.0.112.0/20", False),
    ("0.0.0.0/0", False), ("::/0", False), ("100.64.0.0/16", False), ("169.254.0.0/16", False),
    ("127.0.0.0/16", False), ("10.1.2.3/16", False), ("10.0.0.0/16 }", False),
    ("2001:db8::/48", False)])
def test_a_fleet_network_is_private_and_no_larger_than_a_vpc(text: str, ok: bool) -> None:
    if ok:
        assert str(fleet_network(text)) == text
    else:
        with pytest.raises(Refused, match="Fix:"):
            fleet_network(text)


@pytest.mark.parametrize(("text", "ok"), [("0.0.0.0", True), ("::", True), ("10.0.0.5", True),
                                          ("224.0.0.1", False), ("255.255.255.255", False),
                                          ("ff02::1", False), ("240.0.0.1", False),
                                          ("fe80::1%eth0", False), ("10.0.0.5 ", False)])
def test_a_listen_address_is_unicast(text: str, ok: bool) -> None:
    if ok:
        assert str(listen_address(text)) == text
    else:
        with pytest.raises(Refused):
            listen_address(text)


@pytest.mark.parametrize(("text", "mode"), [("off", "off"), ("self-signed\n", "self-signed"),
                                            ("  off \r\n", "off")])
def test_a_tls_mode_is_one_word(text: str, mode: str) -> None:
    assert TlsMode.parse(text) == mode


@pytest.mark.parametrize("address", ["10.0.0.7", "2001:db8::7"])
def test_a_host_port_brackets_an_ipv6_address(address: str) -> None:
    a = ipaddress.ip_address(address)
    assert writers.host_port(a, 8000) == (f"[{a}]:8000" if a.version == 6 else f"{a}:8000")
    with pytest.raises(Refused):
        writers.host_port(a, 99999)


MD_HOSTILE = ["| a | b |", "## heading", "[x](javascript:alert(1))", "<script>x</script>",
              "**bold** _em_ `code`", "`a | b` | c", "``x` <b>y</b>", "` <a href=x>y</a> `",
              "![img](x.png)", "&lt;", "a\nb", "a\u2028b", "~~s~~",
              "\u202eevil", "1. item", "- item", "> quote", "\\|", "{x}"]


@pytest.mark.parametrize("text", MD_HOSTILE)
def test_markdown_text_shows_the_text_and_makes_no_structure(text: str) -> None:
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    out = writers.markdown_text(text)
    assert "\n" not in out and "\u2028" not in out and "\u202e" not in out
    html = md.render(f"| c |\n|---|\n| {out} |\n")
    # one row of one cell, its text and no element of its own
    assert html.count("<td>") == 1 and html.count("<tr>") == 2, html
    cell = html.split("<td>")[1].split("</td>")[0]
    for tag in ("<a", "<img", "<script", "<strong", "<em", "<h", "<s>", "<del"):
        assert tag not in cell, (text, cell)
    # what shows is the text as written (a code span's backticks aside)
    import html as html_lib
    import re
    shown = html_lib.unescape(re.sub(r"<[^>]+>", "", cell)).replace("`", "")
    if "\n" not in text and "\u2028" not in text and "\u202e" not in text:
        assert " ".join(shown.split()) == " ".join(text.replace("`", "").split()), (text, cell)
    heading = md.render(f"### {out}\n")
    assert heading.count("<h3>") == 1 and "<a" not in heading and "<em" not in heading


def test_a_markdown_link_target_cannot_end_the_link() -> None:
    link = writers.markdown_link("record", "benchmarks/2026-01-01-x) [y](z \"t\".json")
    assert link == "[record](benchmarks/2026-01-01-x%29%20%5By%5D%28z%20%22t%22.json)"
    assert writers.markdown_link("r", "https://evil.example/x").endswith("(https%3A//evil.example/x)")


@pytest.mark.parametrize("bind", ["224.0.0.1", "255.255.255.255", "ff02::1", "240.0.0.1"])
def test_a_profile_never_renders_a_bind_address_no_server_listens_on(bind: str) -> None:
    from inference_image.profiles import ProfileErrors, resolve
    with pytest.raises(ProfileErrors, match=r"router\.bind"):
        resolve("cpu", overrides=[f"router.bind={bind}"])
