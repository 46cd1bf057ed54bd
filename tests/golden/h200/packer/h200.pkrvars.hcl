# Rendered from profiles/h200.yaml (profile sha256 ae1f49ea71e4c810476864e8e91e9d49e52a033f14c1612b4a759250b0690c55): pass with -var-file.
tier           = "h200"
profile_sha256 = "ae1f49ea71e4c810476864e8e91e9d49e52a033f14c1612b4a759250b0690c55"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
