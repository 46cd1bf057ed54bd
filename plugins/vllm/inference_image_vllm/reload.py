"""vLLM's worker extension (--worker-extension-cls) of an instance whose checkpoint holds no copy
of its target's weights (serving.checkpoint_weights: files): the checkpoint helper calls these
methods through vLLM's /collective_rpc around a level-1 sleep.

vLLM's sleep at level 1 copies every allocation tagged "weights" to host memory, where CUDA's
checkpoint and CRIU would write all of it (every weight of the model), and at level 2 discards them
all, the EAGLE-3 head's weights, rotary tables and the samplers' constant tensors included
(vLLM 0.26 allocates those while it loads the model), which its reload_weights does not bring
back. So `inference_image_release_weights` retags only the allocations that hold one large
parameter of the target model each (torch's caching allocator gives a tensor of at least
vLLM's 20 MiB max_split_size a segment of its own while vLLM loads weights): the sleep discards
those and copies everything else to host memory, as level 1 does. Between the wake of the
weights and that of the KV cache (which is still unmapped, so the reload has the GPU's memory to
work in), `inference_image_reload_weights` maps those segments again and reads the target's
weights from its files into them (vLLM's reload_weights, which copies them into the same
storage, so the CUDA graphs captured over them stay valid; the files read whole, ahead of their
turn, each copied to the GPU in one transfer: file_weights). The helper compares the instance's
greedy answer before and after
(docs/decisions.md#checkpoint-and-restore-criu-with-cudas-checkpoint-api).

vLLM 0.26's CuMemAllocator (pointer_to_data, an allocation's handle and tag) is read here; a
vLLM without it fails the release, saying so, and the checkpoint is not taken."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

RELEASED = "inference_image.reloaded_from_files"
# vLLM loads weights under max_split_size_mb=20 (Worker.load_model): a tensor of at least this
# many bytes is a segment of its own, never shared with another tensor
OWN_SEGMENT_BYTES = 20 * 2**20
# torch rounds a large segment up to a multiple of 2 MiB
SEGMENT_ROUNDING = 2 * 2**20
# files read ahead of the one being copied to the GPU, each by a thread of its own
READ_AHEAD = 4
# safetensors' dtype names -> torch's
DTYPES = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "BF16": "bfloat16",
          "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8",
          "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}


def weight_files(model: str) -> list[Path]:
    """The safetensors files a model folder's weights are in (its index's, where it has one),
    in order; none where it has none (a .bin checkpoint: vLLM's own loader reads it)."""
    root = Path(model)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return sorted({root / f for f in json.loads(index.read_text())["weight_map"].values()})
    return sorted(root.glob("*.safetensors"))


def read_file(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    """A safetensors file's header and its tensors' bytes, read whole (one sequential read)."""
    import numpy as np

    with path.open("rb", buffering=0) as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
        data = np.empty(os.fstat(fh.fileno()).st_size - 8 - n, np.uint8)
        view, got = memoryview(data), 0
        while got < len(data):
            k = fh.readinto(view[got:])
            if not k:
                raise OSError(f"{path}: ends {len(data) - got} bytes early")
            got += k
    header.pop("__metadata__", None)
    return header, data


def file_weights(files: list[Path], device: torch.device | str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of `files`, on `device`: each file read whole by a thread ahead of its turn,
    copied to the device in one transfer and cut into its tensors there (vLLM's own iterator
    copies tensor by tensor from a mapping of the file, faulting its pages in one by one)."""
    import torch

    with ThreadPoolExecutor(READ_AHEAD) as pool:
        pending = [pool.submit(read_file, f) for f in files[:READ_AHEAD]]
        for i in range(len(files)):
            header, data = pending.pop(0).result()
            if i + READ_AHEAD < len(files):
                pending.append(pool.submit(read_file, files[i + READ_AHEAD]))
            on_device = torch.from_numpy(data).to(device)
            del data
            for name, meta in header.items():
                start, end = meta["data_offsets"]
                dtype = getattr(torch, DTYPES[meta["dtype"]])
                raw = on_device[start:end]
                if start % dtype.itemsize:  # a view of another type must begin on its alignment
                    raw = raw.clone()
                yield name, raw.view(dtype).view(meta["shape"])


def own_segments(storages: dict[int, int], segments: dict[int, int]) -> list[int]:
    """The segments (start -> size) that hold nothing but one storage (start -> bytes) of at
    least OWN_SEGMENT_BYTES: the storage begins the segment and fills it but for rounding."""
    return [ptr for ptr, size in segments.items()
            if (n := storages.get(ptr, 0)) >= OWN_SEGMENT_BYTES and n <= size < n + SEGMENT_ROUNDING]


class ReloadFromFiles:
    """Methods vLLM adds to its GPU worker (self is the worker)."""

    def inference_image_release_weights(self) -> dict[str, Any]:
        """Tag the segments that hold one large parameter of the target each to be discarded by
        the next sleep (level 1) instead of copied to host memory: their count and bytes, and
        the bytes of parameters left to be copied."""
        try:
            from vllm.device_allocator.cumem import CuMemAllocator

            alloc = CuMemAllocator.get_instance()
            segments = {int(ptr): int(data.handle[1]) for ptr, data in
                        alloc.pointer_to_data.items() if data.tag in ("weights", RELEASED)}
        except (ImportError, AttributeError, IndexError, TypeError) as exc:
            raise RuntimeError(f"inference-image: vLLM's sleep-mode allocator is not the one "
                               f"this reload was written for ({type(exc).__name__}: {exc}); "
                               "checkpoint its weights in host memory instead "
                               "(serving.checkpoint_weights: host)") from None
        storages: dict[int, int] = {}
        for p in self.model_runner.get_model().parameters():  # type: ignore[attr-defined]
            s = p.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        released = own_segments(storages, segments)
        for ptr in released:
            alloc.pointer_to_data[ptr].tag = RELEASED
        freed = sum(segments[p] for p in released)
        return {"segments": len(released), "bytes": freed,
                "kept_parameter_bytes": sum(storages.values()) - freed}

    def inference_image_reload_weights(self) -> dict[str, Any]:
        """The released segments mapped again (vLLM's wake of the weights leaves them: they are
        not tagged so) and the target's weights read from its files into the storage they had:
        the segments mapped and the seconds."""
        import torch
        from vllm.device_allocator.cumem import CuMemAllocator, create_and_map

        t0 = time.monotonic()
        mapped = 0
        for data in CuMemAllocator.get_instance().pointer_to_data.values():
            if data.tag == RELEASED:
                if data.is_asleep:
                    create_and_map(data.handle)
                    data.is_asleep = False
                    mapped += 1
                data.tag = "weights"  # as vLLM tagged it: the next release starts afresh
        runner = self.model_runner  # type: ignore[attr-defined]
        files = weight_files(runner.model_config.model)
        runner.reload_weights(weights_iterator=file_weights(files, self.device)  # type: ignore[attr-defined]
                              if files else None)
        torch.cuda.synchronize()
        return {"segments": mapped, "files": len(files), "s": round(time.monotonic() - t0, 2)}
