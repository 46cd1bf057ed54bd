# Rendered from profiles/cpu.yaml (profile sha256 1d2dda03447a91f1b243792cc9b92446ae00f2ec293730fa8eddb014fdaab469): pass with -var-file.
tier           = "cpu"
profile_sha256 = "1d2dda03447a91f1b243792cc9b92446ae00f2ec293730fa8eddb014fdaab469"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
