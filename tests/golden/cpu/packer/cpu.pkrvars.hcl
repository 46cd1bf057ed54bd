# Rendered from profiles/cpu.yaml (profile sha256 087388bbd8dae9016b8f541f84a70a8d65ef5f5b4c4804fa9eaab97c1d88a0b1): pass with -var-file.
tier           = "cpu"
profile_sha256 = "087388bbd8dae9016b8f541f84a70a8d65ef5f5b4c4804fa9eaab97c1d88a0b1"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
