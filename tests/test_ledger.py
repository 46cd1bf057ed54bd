"""The evidence ledger: docs/results.md and docs/charts/ are what `inference-lab ledger` writes
from the records, a series is "as it ships" only where its profile digest says so, and a chart
that names a series no record holds is one clear error."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from inference_image.profiles import resolve
from inference_lab import cli, ledger


def test_the_committed_results_and_charts_are_the_ledgers_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ledger"]) == 0, capsys.readouterr().out
    for path, text in ledger.outputs(ledger.project_root()).items():
        if path.suffix == ".svg":
            root = ET.fromstring(text)
            assert root.tag.endswith("svg") and root.find("{http://www.w3.org/2000/svg}path") is not None


def _record(tmp_path: Path, commands: dict[str, dict[str, object]]) -> Path:
    rows = [{"concurrency": c, "output_tok_s": 10.0 * c, "ttft_ms_mean": 5.0, "scenario": "chat"}
            for c in (1, 16, 64)]
    proof = {"tier": "h200", "info": {"gpu": "NVIDIA H200"}, "commands": commands,
             "runs": {label: rows for label in commands}}
    (tmp_path / "2026-01-01-proof-run7.json").write_text(json.dumps(
        {"run": 7, "date": "2026-01-01", "note": "", "machines": {"m": proof}}))
    (tmp_path / "old.json").write_text(json.dumps({"gpu": "x"}))
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
    series, other = ledger.load(tmp_path)
    got = {s.label: (s.kind, s.as_ships, sorted(s.rows)) for s in series}
    assert got == {"img": ("image", True, [1, 16, 64]), "placed": ("image", True, [1, 16, 64]),
                   "old": ("image", False, [1, 16, 64]), "other": ("image", False, [1, 16, 64]),
                   "vanilla": ("vanilla", False, [1, 16, 64])}
    assert other == ["old.json"]
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
