"""The environment variables that turn the plugin's parts on, one name each: the render writes
them into a unit's environment (inference_image.render.vllm_env, from the profile), the plugin
reads them here; tests/plugin/test_plugin_switches.py holds the two sets equal."""

FP8_DISPATCH = "INFERENCE_IMAGE_FP8_DISPATCH"            # serving.fp8_gemm_dispatch
FP8_TABLE = "INFERENCE_IMAGE_FP8_TABLE"                  # the lab's tuned table (never rendered)
TRITON_DECODE_TOKENS = "INFERENCE_IMAGE_TRITON_DECODE_TOKENS"  # serving.triton_decode_max_tokens
TRITON_DECODE_VERIFY = "INFERENCE_IMAGE_TRITON_DECODE_VERIFY"  # serving.triton_decode_verify
EARLY_FIRST_TOKEN = "INFERENCE_IMAGE_EARLY_FIRST_TOKEN"  # serving.early_first_token
DECODE_GRAPHS = "INFERENCE_IMAGE_DECODE_GRAPHS"          # serving.cudagraph_mode: full_and_decode
DRAFT_SCHEDULE = "INFERENCE_IMAGE_DRAFT_SCHEDULE"        # FA3 with a draft of other heads
EMPTY_TOP_K = "INFERENCE_IMAGE_EMPTY_TOP_K"              # the cpu tier with speculation
PARALLEL_COMPILE = "INFERENCE_IMAGE_PARALLEL_COMPILE"    # serving.parallel_compile
TRITON_KERNELS = "INFERENCE_IMAGE_TRITON_KERNELS"        # serving.triton_precompile: the tier
TRITON_RECORD = "INFERENCE_IMAGE_TRITON_RECORD"          # the lab's recording (never rendered)
# what the machine's runtime gives a start whose checkpoint helper holds its gate (the machine's
# contract names them: inference_machine.contract.ENV; the plugin, beside vLLM, has not that
# package, and tests/plugin/test_plugin_switches.py holds the two equal)
CHECKPOINT_TOKEN = "INFERENCE_CHECKPOINT_TOKEN"          # the helper's token through the gate
CHECKPOINT_GATE = "INFERENCE_CHECKPOINT_GATE"            # the gate's flag file

# what the render may write (the lab's table path is the lab's own)
RENDERED = (FP8_DISPATCH, TRITON_DECODE_TOKENS, TRITON_DECODE_VERIFY, EARLY_FIRST_TOKEN,
            DECODE_GRAPHS, DRAFT_SCHEDULE, EMPTY_TOP_K, PARALLEL_COMPILE, TRITON_KERNELS)
