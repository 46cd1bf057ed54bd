# Rendered from profiles/h200.yaml (profile sha256 47a87e7c7a00c0ebcf7563483b11d081ea11b6287d22ac5e54e45a316be54e21): pass with -var-file.
tier           = "h200"
profile_sha256 = "47a87e7c7a00c0ebcf7563483b11d081ea11b6287d22ac5e54e45a316be54e21"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
