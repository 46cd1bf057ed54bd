# Rendered from profiles/cpu.yaml (profile sha256 7568eed4429bb0d91687d7f67aaf6c1fb7346dc753ede3761a7b0cd968d2e7c8): pass with -var-file.
tier           = "cpu"
profile_sha256 = "7568eed4429bb0d91687d7f67aaf6c1fb7346dc753ede3761a7b0cd968d2e7c8"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
