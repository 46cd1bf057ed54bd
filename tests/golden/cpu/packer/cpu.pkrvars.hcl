# Rendered from profiles/cpu.yaml (profile sha256 ef3678f65ea236959c157f8e4589a498d4aa7ce6205d234166df7a51e13c9a8a): pass with -var-file.
tier           = "cpu"
profile_sha256 = "ef3678f65ea236959c157f8e4589a498d4aa7ce6205d234166df7a51e13c9a8a"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
