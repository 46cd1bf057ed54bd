# Rendered from profiles/l40s.yaml (profile sha256 f16356942ea3e9cd90659c2069cb377f3de81ad7519df586da36b23503b06770): pass with -var-file.
tier           = "l40s"
profile_sha256 = "f16356942ea3e9cd90659c2069cb377f3de81ad7519df586da36b23503b06770"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
