# Rendered from profiles/h100.yaml (profile sha256 bd9fd93cfcb42ad448dddbdbd0922acc0059c9f72dd9f453ebbb86f6147ac0ae): pass with -var-file.
tier           = "h100"
profile_sha256 = "bd9fd93cfcb42ad448dddbdbd0922acc0059c9f72dd9f453ebbb86f6147ac0ae"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
