# Rendered from profiles/h200.yaml (profile sha256 c3a6ba4fef50dfe31fea1d69b7dac065b0a4734ec3ff382bec1e590a2eee0211): pass with -var-file.
tier           = "h200"
profile_sha256 = "c3a6ba4fef50dfe31fea1d69b7dac065b0a4734ec3ff382bec1e590a2eee0211"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
