# Rendered from profiles/h100.yaml (profile sha256 939970081de68a0d8e371c95e0897494e2f25f63b7d95184ad9c7861c19ffe01): pass with -var-file.
tier           = "h100"
profile_sha256 = "939970081de68a0d8e371c95e0897494e2f25f63b7d95184ad9c7861c19ffe01"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
