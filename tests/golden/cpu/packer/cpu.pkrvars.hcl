# Rendered from profiles/cpu.yaml (profile sha256 21b287ff638ba35a88c442e3a51f9d055bd5248741085f9fe41dcd13966df7d9): pass with -var-file.
tier           = "cpu"
profile_sha256 = "21b287ff638ba35a88c442e3a51f9d055bd5248741085f9fe41dcd13966df7d9"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
