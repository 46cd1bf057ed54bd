# Rendered from profiles/cpu.yaml (profile sha256 848bca1f230ea6d6a98b3b694c60138fb7e98bce06869ee9a11f86ffce93475b): pass with -var-file.
tier           = "cpu"
profile_sha256 = "848bca1f230ea6d6a98b3b694c60138fb7e98bce06869ee9a11f86ffce93475b"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
