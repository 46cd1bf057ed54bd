# Rendered from profiles/h100.yaml (profile sha256 93892ba22746ade1e6c04dd4a4c77b7407596de50a9de0da6be580d44cc58dc1): pass with -var-file.
tier           = "h100"
profile_sha256 = "93892ba22746ade1e6c04dd4a4c77b7407596de50a9de0da6be580d44cc58dc1"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
