"""Run by Python at start-up in the servers `inference-lab proof` starts (this folder leads their
PYTHONPATH), never on an image: it makes a weightless EAGLE-3 head cost what its checkpoint costs.

The published EAGLE-3 head for Llama 3.1 8B carries its own lm_head over a 32,000-token draft
vocabulary. vLLM learns that a head owns its lm_head only while reading its weights
(`has_own_lm_head`, set by the weight names); under `--load-format dummy` nothing is read, so the
head borrows the target's 128,256-token lm_head instead: 4x the bytes read per draft token.
A head whose config names a draft vocabulary of its own is marked as owning its lm_head, as its
checkpoint would make it.

Embeddings likewise: the Llama 3.3 70B head is 6144 wide on an 8192-wide target, so its
checkpoint carries its own 6144-wide embed_tokens. Under a dummy load vLLM's V2 runner lends it
the target's (8192 wide) and the first draft step fails ("hidden_states and input_embeds must have
the same last dimension", seen on an H200). A head narrower than its target owns its embedding.

Where a step sets PROOF_STACKS_DIR (`proof step stacks`), it also starts proof_stacks.py's sampler
of Python stacks in each process.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from typing import Any

MODULE = "vllm.model_executor.models.llama_eagle3"


def _patch(module: Any) -> None:
    cls = module.Eagle3LlamaForCausalLM
    init = cls.__init__

    # wraps: vLLM picks the constructor's arguments by its signature (`vllm_config=`)
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        cfg = self.config
        if getattr(cfg, "draft_vocab_size", None) not in (None, cfg.vocab_size):
            self.has_own_lm_head = True
            print(f"inference-lab proof stand-in: the EAGLE-3 head keeps its own lm_head "
                  f"({cfg.draft_vocab_size} x {cfg.hidden_size}), as its checkpoint would",
                  file=sys.stderr, flush=True)
        if getattr(cfg, "target_hidden_size", None) not in (None, cfg.hidden_size):
            self.has_own_embed_tokens = True
            print(f"inference-lab proof stand-in: the EAGLE-3 head keeps its own embed_tokens "
                  f"({cfg.vocab_size} x {cfg.hidden_size}; target {cfg.target_hidden_size} wide)",
                  file=sys.stderr, flush=True)

    cls.__init__ = __init__


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Finder())

# The proof's host-stack sampler (proof_stacks.py), in the servers whose step asks for it.
try:
    import proof_stacks

    proof_stacks.install()
except Exception as exc:  # a measuring aid must never stop a server
    print(f"inference-lab proof: no stack sampler: {exc}", file=sys.stderr, flush=True)
