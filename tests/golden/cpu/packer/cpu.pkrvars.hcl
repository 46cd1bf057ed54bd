# Rendered from profiles/cpu.yaml (profile sha256 2ebe24c1a25008b259c076a7c7961fa126b237382be0dac934f39021db736490): pass with -var-file.
tier           = "cpu"
profile_sha256 = "2ebe24c1a25008b259c076a7c7961fa126b237382be0dac934f39021db736490"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
