"""The vLLM plugin's kernel table (plugins/vllm): how a batch size finds its kernel, and when a
table is not used. The kernels themselves run on the GPU machine only (`inference-lab proof step tune`)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "plugins/vllm"))
from inference_image_vllm import dispatch

LLAMA_8B_SHAPES = {"6144,4096", "4096,4096", "28672,4096", "4096,14336"}  # qkv, o, gate_up, down


@pytest.fixture
def table_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"device": "X", "capability": "9.0", "shapes": {
        "4096,4096": [[32, "cublaslt"], [1, "cutlass"], [16, "cutlass"], [64, "cublaslt_fast"]]}}))
    monkeypatch.setenv("INFERENCE_IMAGE_FP8_TABLE", str(p))
    monkeypatch.setattr(dispatch, "_table", None)
    return p


def test_batch_runs_the_entry_of_the_smallest_measured_size_that_holds_it(table_file):
    t = dispatch.Table(str(table_file))
    assert [t.kernel(m, 4096, 4096) for m in (1, 2, 16, 17, 32, 33, 64)] == \
        ["cutlass", "cutlass", "cutlass", "cublaslt", "cublaslt", "cublaslt_fast", "cublaslt_fast"]
    assert t.kernel(65, 4096, 4096) == "cutlass"  # beyond the table
    assert t.kernel(32, 6144, 4096) == "cutlass"  # a shape it does not cover


def test_table_of_another_compute_capability_is_not_used(table_file, monkeypatch):
    monkeypatch.setattr(dispatch, "capability", lambda: "8.9")
    t = dispatch.table()
    assert t.entries == {} and t.kernel(32, 4096, 4096) == "cutlass"
    assert t.source.startswith("none:") and "9.0" in t.source


def test_table_of_this_compute_capability_is_used(table_file, monkeypatch):
    monkeypatch.setattr(dispatch, "capability", lambda: "9.0")
    assert dispatch.table().kernel(32, 4096, 4096) == "cublaslt"


def test_unknown_kernel_name_is_refused(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"shapes": {"4096,4096": [[1, "marlin"]]}}))
    with pytest.raises(ValueError, match="unknown kernel"):
        dispatch.Table(str(p))


def assert_every_shape_covers_the_graph_sizes(path: Path) -> None:
    """Each shape from vLLM's smallest CUDA-graph sizes up to at least 64 rows."""
    t = dispatch.Table(str(path))
    for n, k in t.entries:
        sizes = [m for m, _ in t.entries[(n, k)]]
        assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] >= 64, (n, k, sizes)


# each tier, and the tier on its GPU model with the largest step budget (tune's --prefill-to)
@pytest.mark.parametrize(("tier", "budget_tier"), [("h100", "h100x8"), ("h200", "h200"), ("h200x8", "h200")])
def test_packaged_table_covers_the_shapes_and_steps_of_every_fp8_tier_on_its_gpu(
        tier, budget_tier, monkeypatch):
    """The table a tier's GPU picks (by name, else the architecture's) holds every FP8 GEMM shape
    the tiers on that GPU model serve, as `proof step tune` derives them from the catalog (the
    H100's holds the h100 tier's 8B and the h100x8's 70B at TP=2): a target changed in the catalog
    must be re-tuned, or its GEMMs would silently fall back to Cutlass."""
    from inference_image.profiles import resolve
    from inference_image_vllm import tune
    from inference_lab import proof

    r = resolve(tier)
    monkeypatch.setattr(dispatch, "device_name", lambda: r.profile.hardware.gpu_model)
    path = dispatch.packaged_table()
    assert path is not None
    data = json.loads(path.read_text())
    args = proof.tune_models(r)
    models = [tune.model_arg(v) for k, v in itertools.pairwise(args) if k == "--model"]
    want = {f"{n},{k}" for k, n in tune.all_shapes(models).values()}
    assert data["device"] == r.profile.hardware.gpu_model and data["capability"] == "9.0"
    assert set(data["shapes"]) == want
    assert_every_shape_covers_the_graph_sizes(path)
    # and every prefill step the tiers run (Cutlass doubles a 513-row step's GEMMs:
    # docs/decisions.md#the-fp8-table-covers-prefill-steps-too-in-row-ranges),
    # up to the budget tune is given: a table re-tuned without --prefill-to would drop that
    # silently. The H100's reaches past it: tuned to 8192 rows, the h100x8's
    # budget then.
    budget = int(args[args.index("--prefill-to") + 1])
    assert budget == resolve(budget_tier).profile.serving.max_num_batched_tokens
    assert min(rows[-1][0] for rows in dispatch.Table(str(path)).entries.values()) >= budget


def test_a_table_written_by_tune_is_used_on_its_own_compute_capability(tmp_path, monkeypatch):
    # tune writes through dispatch.document; a table without its capability would be refused
    # everywhere, silently leaving Cutlass on every GEMM.
    p = tmp_path / "tuned.json"
    p.write_text(json.dumps(dispatch.document(
        {"4096,4096": [[1, "cublaslt"]]}, device="NVIDIA H100 80GB HBM3", capability="9.0",
        torch_version="2.11.0", vllm_version="0.26.0")))
    monkeypatch.setenv("INFERENCE_IMAGE_FP8_TABLE", str(p))
    monkeypatch.setattr(dispatch, "_table", None)
    monkeypatch.setattr(dispatch, "capability", lambda: "9.0")
    t = dispatch.table()
    assert t.source == str(p) and t.kernel(1, 4096, 4096) == "cublaslt"


def test_triton_gemv_entries_are_read_and_checked(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"capability": "9.0", "shapes": {
        "4096,4096": [[1, "triton:8:512:4:4"], [4, "cutlass"]]}}))
    t = dispatch.Table(str(p))
    assert t.kernel(1, 4096, 4096) == "triton:8:512:4:4" and t.kernel(2, 4096, 4096) == "cutlass"
    assert dispatch.parse_gemv("triton:8:512:4:4") == (8, 512, 4, 4)
    assert dispatch.parse_gemv("cutlass") is None
    for rows, kern, msg in ((8, "triton:8:512:4:4", "serves at most 4"),
                            (1, "triton:8:512", "want triton:BLOCK_N")):
        p.write_text(json.dumps({"shapes": {"4096,4096": [[rows, kern]]}}))
        with pytest.raises(ValueError, match=msg):
            dispatch.Table(str(p))
    with pytest.raises(ValueError, match="powers of two"):
        dispatch.parse_gemv("triton:6:512:4:4")


def test_every_gemv_config_tune_tries_is_a_valid_name():
    assert all(dispatch.parse_gemv(c) for c in dispatch.GEMV_CONFIGS)
    assert len(set(dispatch.GEMV_CONFIGS)) == len(dispatch.GEMV_CONFIGS) == 10


def test_prefill_rows_are_covered_in_ranges_each_measured_at_both_ends():
    """Past the CUDA-graph sizes a step's GEMMs run at its exact row count, so the table covers
    ranges up to the step budget, narrow where Cutlass' 256-row jumps cost the most."""
    from inference_image_vllm import tune

    r = tune.prefill_ranges(128, 2048)
    assert r[:2] == [(129, 192), (193, 256)] and (513, 576) in r and r[-1] == (1921, 2048)
    assert all(b == a + 1 for (_, a), (b, _) in itertools.pairwise(r))  # no row left out
    assert {last - first + 1 for first, last in r} == {64, 128}
    assert tune.prefill_ranges(128, 1000)[-1] == (961, 1000) and tune.prefill_ranges(128, 0) == []
    assert len(tune.prefill_ranges(128, 8192)) == 38
    # the range is decided on both ends' times together, among kernels as accurate as Cutlass
    err = {"cutlass": 0.01, "cublaslt": 0.01, "cublaslt_fast": 0.05}
    assert tune.pick({"cutlass": 114 + 99, "cublaslt": 58 + 66, "cublaslt_fast": 50 + 50},
                     err, 0.03) == "cublaslt"
    assert tune.pick({"cutlass": 100, "cublaslt": 98, "cublaslt_fast": 50}, err, 0.03) == "cutlass"


def test_a_prefill_row_count_runs_its_ranges_kernel(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"capability": "9.0", "shapes": {"8192,8192": [
        [128, "cutlass"], [512, "cutlass"], [576, "cublaslt"], [2048, "cutlass"]]}}))
    t = dispatch.Table(str(p))
    assert [t.kernel(m, 8192, 8192) for m in (512, 513, 576, 577, 2048, 2049)] == \
        ["cutlass", "cublaslt", "cublaslt", "cutlass", "cutlass", "cutlass"]


def test_tune_shapes_for_any_llama_and_its_tensor_parallel_split():
    from inference_image_vllm import tune
    # the 8B's four projections are the ones the packaged table covers
    assert {f"{n},{k}" for k, n in tune.SHAPES.values()} == LLAMA_8B_SHAPES
    # Llama 3.3 70B on one GPU, and on one of two (h100x8: TP=2): column-parallel layers split N,
    # row-parallel ones split K
    assert tune.shapes(8192, 28672, 64, 8, 128) == {
        "qkv": (8192, 10240), "o": (8192, 8192), "gate_up": (8192, 57344), "down": (28672, 8192)}
    assert tune.shapes(8192, 28672, 64, 8, 128, 2) == {
        "qkv": (8192, 5120), "o": (4096, 8192), "gate_up": (8192, 28672), "down": (14336, 8192)}
    both = tune.all_shapes([tune.LLAMA_8B, (8192, 28672, 64, 8, 128, 1)])
    assert len(both) == 8 and "qkv@1" in both
    with pytest.raises(Exception, match="does not split over 3"):
        tune.model_arg("8192,28672,64,8,128,3")
    with pytest.raises(Exception, match="as integers"):
        tune.model_arg("8192,big,64,8,128")


def test_a_table_of_this_gpu_model_comes_before_the_architecture_one(tmp_path, monkeypatch):
    assert dispatch.table_file_name("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3.json"
    assert dispatch.table_file_name("NVIDIA H200") == "nvidia-h200.json"
    packaged = Path(dispatch.__file__).with_name("tables")
    monkeypatch.setattr(dispatch, "device_name", lambda: "NVIDIA Made Up 9000")
    assert dispatch.packaged_table() == packaged / "hopper.json"
    monkeypatch.setattr(dispatch, "TABLES", tmp_path)
    assert dispatch.packaged_table() is None  # neither: Cutlass everywhere
    (tmp_path / "hopper.json").write_text("{}")
    own = tmp_path / "nvidia-made-up-9000.json"
    own.write_text(json.dumps({"device": "NVIDIA Made Up 9000", "capability": "9.0",
                               "shapes": {"8192,8192": [[1, "cutlass"]]}}))
    assert dispatch.packaged_table() == own


def test_the_proof_names_the_table_through_the_variable_the_plugin_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`proof step profile --fp8-table tuned` sets proof.FP8_TABLE_ENV for the server; were the
    two names to drift apart, the 'tuned' rows would quietly serve the packaged table."""
    from inference_lab import proof

    p = tmp_path / "tuned.json"
    p.write_text(json.dumps({"device": "X", "capability": "9.0",
                             "shapes": {"4096,4096": [[1, "cublaslt"]]}}))
    monkeypatch.setattr(dispatch, "capability", lambda: "9.0")
    monkeypatch.delenv("INFERENCE_IMAGE_FP8_TABLE", raising=False)
    monkeypatch.setenv(proof.FP8_TABLE_ENV, str(p))
    monkeypatch.setattr(dispatch, "_table", None)
    assert dispatch.table().source == str(p)


def test_a_part_installs_once_a_process_and_again_after_a_failed_try():
    """vLLM calls the plugin's register in every process it starts, sometimes twice in one: a
    part's install runs once, and one that raised (a malformed table) is tried again, since
    nothing of it is in place."""
    import inference_image_vllm

    calls: list[int] = []

    @inference_image_vllm.once
    def install() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ValueError("table malformed")

    with pytest.raises(ValueError, match="table malformed"):
        install()
    install()
    install()
    assert calls == [0, 1]
    assert install.__name__ == "install"
