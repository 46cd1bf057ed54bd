# Rendered from profiles/cpu.yaml (profile sha256 b82a990f9a2d891abc7565642eb342bb2d144b58b794f0020f242ecd674f0b8f): pass with -var-file.
tier           = "cpu"
profile_sha256 = "b82a990f9a2d891abc7565642eb342bb2d144b58b794f0020f242ecd674f0b8f"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
