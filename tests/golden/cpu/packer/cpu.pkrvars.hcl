# Rendered from profiles/cpu.yaml (profile sha256 431903ea0b856af39c8349b92eb60499b89f3c0f25ae3da65670ddb76984d234): pass with -var-file.
tier           = "cpu"
profile_sha256 = "431903ea0b856af39c8349b92eb60499b89f3c0f25ae3da65670ddb76984d234"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
