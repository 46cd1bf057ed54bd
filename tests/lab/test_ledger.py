"""The evidence ledger: docs/benchmarks.md and docs/charts/ are what `inference-lab ledger` writes
from the records, every record is of one schema (a record that is not is one clear error naming
its file and field), a series is "as it ships" only where its profile digest says so, and a chart
that names a series no record holds is one clear error."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import anchors

from inference_image.profiles import resolve
from inference_lab import cli, ledger


def test_the_committed_results_and_charts_are_the_ledgers_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ledger"]) == 0, capsys.readouterr().out
    for path, text in ledger.outputs(ledger.project_root()).items():
        if path.suffix == ".svg":
            root = ET.fromstring(text)
            # something is drawn (matplotlib's charts nest their paths in groups)
            assert root.tag.endswith("svg") and next(
                root.iter("{http://www.w3.org/2000/svg}path"), None) is not None


def _record(tmp_path: Path, commands: dict[str, dict[str, object]]) -> Path:
    rows = [{"concurrency": c, "output_tok_s": 10.0 * c, "ttft_ms_mean": 5.0, "scenario": "chat"}
            for c in (1, 16, 64)]
    proof = {"tier": "h200", "info": {"gpu": "NVIDIA H200"}, "commands": commands,
             "runs": {label: rows for label in commands}}
    (tmp_path / "2026-01-01-proof-run7.json").write_text(json.dumps(
        {"schema": 1, "kind": "proof", "run": 7, "date": "2026-01-01", "title": "t", "note": "n",
         "tiers": {"m": "h200"}, "machines": {"m": proof}}))
    (tmp_path / "2026-01-02-soak.json").write_text(json.dumps(
        {"schema": 1, "kind": "soak", "date": "2026-01-02", "title": "t", "note": "n",
         "data": {"rows": [{"minute": 1, "ok": 640, "p50_ms": 378.0}]}}))
    return tmp_path


def test_a_series_ships_only_where_its_digest_is_the_tiers(tmp_path: Path) -> None:
    placed = ["serving.base_port=8200"]
    _record(tmp_path, {
        "img": {"profile_sha256": resolve("h200").digest, "sets": []},
        "placed": {"profile_sha256": resolve("h200", overrides=placed).digest, "sets": placed},
        "old": {"profile_sha256": "0" * 64, "sets": []},
        "other": {"profile_sha256": resolve("h200", overrides=["serving.max_num_seqs=8"]).digest,
                  "sets": ["serving.max_num_seqs=8"]},
        "vanilla": {"argv": "vllm serve", "sets": []}})
    series, recs = ledger.load(tmp_path)
    got = {s.label: (s.kind, s.as_ships, sorted(s.rows)) for s in series}
    assert got == {"img": ("image", True, [1, 16, 64]), "placed": ("image", True, [1, 16, 64]),
                   "old": ("image", False, [1, 16, 64]), "other": ("image", False, [1, 16, 64]),
                   "vanilla": ("vanilla", False, [1, 16, 64])}
    assert [(r.name, r.kind, r.anchor()) for r in recs] == [
        ("2026-01-01-proof-run7.json", "proof", "run-7"), ("2026-01-02-soak.json", "soak",
                                                          "2026-01-02-soak")]
    assert ledger.data_table(recs[1].doc["data"]) == ("| minute | ok | p50 ms |\n|---|---|---|\n"
                                                      "| 1 | 640 | 378 |\n")
    table = ledger.table("h200", series)
    assert "| [7](benchmarks/2026-01-01-proof-run7.json) | m (H200) | as it ships (img) | 10.0 |" in table
    ch = ledger.charts(series, {"h200": {"run": 7, "image": [["m", "img"]],
                                         "vanilla": [["m", "vanilla"]],
                                         "left_out": {"vanilla": [64]}}})[0]
    assert ch.speedup() == {1: 1.0, 16: 1.0}  # c=64 left out of vanilla: no ratio there


def test_a_chart_naming_a_series_no_record_holds_is_one_error(tmp_path: Path) -> None:
    _record(tmp_path, {"vanilla": {"argv": "vllm serve", "sets": []}})
    series, _ = ledger.load(tmp_path)
    with pytest.raises(ledger.LedgerError, match=r"^charts.json h200.image: run 7 has no series "
                       r"'img' on machine 'm'. Fix: name one the record holds$"):
        ledger.charts(series, {"h200": {"run": 7, "image": [["m", "img"]],
                                        "vanilla": [["m", "vanilla"]]}})


def _good() -> dict[str, object]:
    return {"schema": 1, "kind": "proof", "run": 3, "date": "2026-01-01", "title": "t", "note": "n",
            "tiers": {"m": "h100"}, "machines": {"m": {}}}


@pytest.mark.parametrize(("change", "message"), [
    ({"schema": None}, r"schema is None, not 1\. Fix: set \"schema\": 1"),
    ({"kind": "notes"}, r"kind is 'notes'\. Fix: one of proof, "),
    ({"date": "2026-01-02"}, r"date is '2026-01-02'\. Fix: the day it was measured"),
    ({"note": " "}, r"note is missing or empty\. Fix: say in one paragraph"),
    ({"run": "3"}, r"run is '3'\. Fix: the run's number, a positive integer"),
    ({"machines": {}}, r"machines is not an object of proof documents"),
    ({"tiers": {"x": "h100"}}, r"tiers does not name a tier for each machine"),
    ({"kind": "soak", "run": None}, r"data is not an object\. Fix: put what was measured"),
])
def test_a_record_off_the_schema_is_one_error_naming_its_field(
        tmp_path: Path, change: dict[str, object], message: str) -> None:
    doc = _good() | change
    (tmp_path / "2026-01-01-x.json").write_text(json.dumps({k: v for k, v in doc.items()
                                                            if v is not None or k == "schema"}))
    with pytest.raises(ledger.LedgerError, match=r"^2026-01-01-x\.json: " + message):
        ledger.records(tmp_path)


def test_a_run_is_one_record_and_a_record_is_json(tmp_path: Path) -> None:
    for name in ("2026-01-01-a.json", "2026-01-01-b.json"):
        (tmp_path / name).write_text(json.dumps(_good()))
    with pytest.raises(ledger.LedgerError, match=r"^2026-01-01-b.json: run 3 is also "
                       r"2026-01-01-a.json's\. Fix: one record a run"):
        ledger.records(tmp_path)
    (tmp_path / "2026-01-01-b.json").write_bytes(b"\xff{")
    with pytest.raises(ledger.LedgerError, match=r"2026-01-01-b.json: not UTF-8 text"):
        ledger.records(tmp_path)


def test_every_committed_record_is_of_the_one_schema() -> None:
    recs = ledger.records(ledger.project_root() / "docs" / "benchmarks")
    assert {r.kind for r in recs} <= set(ledger.KINDS) and len(recs) >= 60
    page = (ledger.project_root() / "docs" / "benchmarks.md").read_text()
    linked = anchors(ledger.project_root() / "docs" / "benchmarks.md")
    for r in recs:
        assert f"### {r.heading()}\n" in page and f"(benchmarks/{r.name})" in page
        assert r.anchor() in linked  # what docs link to, e.g. benchmarks.md#run-N


def test_the_evidence_names_no_path_of_the_machine_it_was_written_on() -> None:
    """A record says what was run in the repository's terms (a fresh clone, a path under the
    checkout), never where this checkout or its neighbours sit on the build host."""
    root = ledger.project_root()
    own = [str(root.resolve()) + "/", "../shared/", "/tmp/fresh"]
    pages = [root / "docs" / "benchmarks.md", *sorted((root / "docs" / "benchmarks").glob("*.json"))]
    found = {p.name: w for p in pages for w in own if w in p.read_text()}
    assert not found, found


def test_ready_time_shows_the_newest_starts_as_shipped_and_the_newest_restore() -> None:
    """The ready table keeps the newest run of the render as it ships beside the newest run
    that restored a checkpoint (its server ran with sleep mode, labelled so); a run with sleep
    mode that restored nothing is left out; the restore's phases get their own columns."""
    from inference_lab import ready_chart

    def proof(sleep: bool, restored: bool) -> dict[str, object]:
        starts: dict[str, object] = {"cold": {"answered_s": 130.0, "phases": [
            ["api_imports", 30.0], ["first_answer", 0.1]]}}
        if restored:
            starts["checkpoint"] = {"answered_s": 18.4, "phases": [
                ["validate", 0.1], ["criu_restore", 15.0], ["first_answer", 0.2]]}
        return {"ready": {"h100": {"sleep_mode": sleep, "order": ["cold", "checkpoint"],
                                   "starts": starts}}}

    found = [*ready_chart.starts(60, "a", proof(False, False)),
             *ready_chart.starts(61, "b", proof(True, False)),
             *ready_chart.starts(62, "c", proof(True, True)),
             *ready_chart.starts(59, "d", proof(False, False))]
    rows = ready_chart.newest(found)
    assert [(s.run, s.state, s.name()) for s in rows] == [
        (60, "cold", "image, cold (a)"), (62, "cold", "image + checkpoint, cold (c)"),
        (62, "checkpoint", "image + checkpoint, checkpoint (c)")]
    # a tier that ships without serving.checkpoint, --set to restore its own checkpoint: charted
    # among the restored starts; any other --set is a variant, and left out
    for run, sets in ((63, ["serving.checkpoint=true", "serving.engine_process=spawn"]),
                      (64, ["serving.checkpoint=true", "serving.max_num_seqs=8"])):
        found += ready_chart.starts(run, "e", {**proof(True, True),
                                               "commands": {"h100": {"sets": sets}}})
    assert [(s.run, s.state) for s in ready_chart.newest(found)][1:] == [
        (63, "cold"), (63, "checkpoint")]
    # one whose checkpoint left its weights to the model's files: charted so, and labelled
    found += ready_chart.starts(65, "f", {**proof(True, True), "commands": {"h100": {"sets": [
        "serving.checkpoint=true", "serving.engine_process=spawn",
        "serving.checkpoint_weights=files"]}}})
    assert [s.name() for s in ready_chart.newest(found)][1:] == [
        "image + checkpoint (weights from files), cold (f)",
        "image + checkpoint (weights from files), checkpoint (f)"]
    table = ready_chart.table(rows)
    head = table.splitlines()[0]
    assert "criu_restore" in head and "cuda_restore" not in head
    assert head.index("criu_restore") < head.index("first_answer")
    assert "| 18.4 |" in table.splitlines()[-1] and "| 15.0 |" in table.splitlines()[-1]
    assert ready_chart.table(rows[:1]).splitlines()[0].count("criu_restore") == 0


def test_ready_time_keeps_an_older_runs_bundle_start_when_the_newest_timed_only_cold() -> None:
    """A run that times vanilla and the render cold only (a same-call pair) replaces those rows;
    the bundle start stays the newest run's that had one (an older run's warm start does not),
    and each row names its run."""
    from inference_lab import ready_chart

    def proof(states: list[str], vanilla: bool = False) -> dict[str, object]:
        starts = {st: {"answered_s": 40.0 if st == "bundle" else 90.0,
                       "phases": [["compile", 10.0], ["first_answer", 0.1]]} for st in states}
        return {"ready": {"x": {"vanilla": vanilla, "order": states, "starts": starts}}}

    found = [*ready_chart.starts(1, "w", proof(["cold", "warm", "bundle"])),
             *ready_chart.starts(2, "a", proof(["cold", "bundle"])),
             *ready_chart.starts(2, "a", proof(["cold"], vanilla=True)),
             *ready_chart.starts(3, "b", proof(["cold"])),
             *ready_chart.starts(3, "b", proof(["cold"], vanilla=True))]
    rows = ready_chart.newest(found)
    assert [(s.run, s.name()) for s in rows] == [
        (3, "vanilla vLLM, cold (b)"), (3, "image, cold (b)"), (2, "image, bundle (a)")]
    assert [ln.split(" |")[0] for ln in ready_chart.table(rows).splitlines()[2:]] == [
        "| vanilla vLLM, cold (b), run 3", "| image, cold (b), run 3",
        "| image, bundle (a), run 2"]


def test_a_ready_variant_stays_in_its_record_and_out_of_the_chart() -> None:
    """A ready step that --set a field of the profile (a variant: parallel_compile=false) is not
    the render as it ships; one that only placed it (its GPUs, ports) is."""
    from inference_lab import ready_chart

    cold = {"order": ["cold"], "starts": {"cold": {"answered_s": 97.7, "phases": [
        ["compile", 42.8], ["first_answer", 0.1]]}}}
    proof = {"ready": {"pc": cold, "seq": cold, "placed": cold},
             "commands": {"pc": {"sets": []},
                          "seq": {"sets": ["serving.parallel_compile=false"]},
                          "placed": {"sets": ["serving.gpu_ids=[1]"]}}}
    assert [s.label for s in ready_chart.starts(66, "a", proof)] == ["pc", "placed"]


def test_a_ready_steps_rows_ship_only_without_sleep_mode(tmp_path: Path) -> None:
    """A ready step's bench rows are named after their start (img-bundle, img-checkpoint) and
    read its command; a step run for a checkpoint (sleep mode, a spawned engine) is not the image
    as it ships, neither its source server's rows nor its restore's."""
    digest = resolve("h200").digest
    _record(tmp_path, {"img": {"profile_sha256": digest, "sets": []},
                       "ck": {"profile_sha256": digest, "sets": []}})
    doc = json.loads((tmp_path / "2026-01-01-proof-run7.json").read_text())
    proof = doc["machines"]["m"]
    rows = proof["runs"].pop("img")
    proof["runs"] = {"img-bundle": rows, "ck-cold": rows, "ck-checkpoint": rows, "ck-restart": rows}
    proof["ready"] = {"img": {"sleep_mode": False}, "ck": {"sleep_mode": True}}
    (tmp_path / "2026-01-01-proof-run7.json").write_text(json.dumps(doc))
    series, _ = ledger.load(tmp_path)
    assert {s.label: s.as_ships for s in series} == {
        "img-bundle": True, "ck-cold": False, "ck-checkpoint": False, "ck-restart": False}


def _ready(start: dict[str, object], order: list[object] | None = None) -> dict[str, object]:
    return _good() | {"machines": {"m": {"tier": "h100", "ready": {"r": {
        "order": order if order is not None else ["cold"], "starts": {"cold": start}}}}}}


@pytest.mark.parametrize(("doc", "field"), [
    (_good() | {"machines": {"m": {"tier": "h100", "ready": [1]}}}, r"ready is not"),
    (_good() | {"machines": {"m": {"tier": "h100", "ready": {"r": "cold"}}}}, r"ready\.r is not"),
    (_ready({"answered_s": "abc", "phases": []}), r"starts\.cold\.answered_s is 'abc'"),
    (_ready({"answered_s": 10.0, "phases": [["compile"]]}), r"phases holds \['compile'\]"),
    (_ready({"answered_s": 10.0, "phases": [["compile", "x"]]}), r"phases\.compile is 'x'"),
    (_ready({"answered_s": 10.0, "phases": [["compile", -1.0]]}), r"phases\.compile is -1\.0"),
    (_ready({"answered_s": 1.0}, order=[1]), r"ready\.r\.order is not a list of start names"),
    (_ready({"answered_s": 1.0}, order=["cold | x"]), r"ready\.r\.order is not a list of start"),
])
def test_a_ready_record_off_its_shape_is_one_error_naming_the_field(
        tmp_path: Path, doc: dict[str, object], field: str) -> None:
    (tmp_path / "2026-01-01-x.json").write_text(json.dumps(doc))
    with pytest.raises(ledger.LedgerError,
                       match=r"^2026-01-01-x\.json: machines\.m\.(.*\.)?" + field + ".*Fix:"):
        ledger.records(tmp_path)


HOSTILE = ["m | 0.1 | x", "cold | 0.1 | 0.1 |\n| image, fake row", "## Runs", "<b>x</b>",
           "[x](https://evil.example)", "a\u2028b", "\u202eevil", "x](y) [z"]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_records_text_is_text_on_the_page(tmp_path: Path, text: str) -> None:
    """A record's title, note, machine names and step labels reach
    docs/benchmarks.md as text in a heading or a cell: no row, heading, tag or link of their
    own (read back by a CommonMark parser with GitHub's tables)."""
    from markdown_it import MarkdownIt
    doc = _good() | {"title": f"t {text}", "note": f"n {text}",
                     "tiers": {f"m {text}": "h100"},
                     "machines": {f"m {text}": {"tier": "h100", "ready": {f"r {text}": {
                         "order": ["cold"], "starts": {"cold": {"answered_s": 1.0,
                                                               "phases": []}}}}}}}
    (tmp_path / "2026-01-01-x.json").write_text(json.dumps(doc))
    recs = ledger.records(tmp_path)
    page = ledger.benchmarks_md([], recs, [], ["h100"], ledger.ready_starts(recs))
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(page)
    for tag in ("<a href=\"https://evil", "<b>", "fake row</td>"):
        assert tag not in html, page
    assert html.count("<h2>") == page.count("\n## ") + page.startswith("## "), page
    assert html.count("<tr>") == 2, "one header row and one start row"
