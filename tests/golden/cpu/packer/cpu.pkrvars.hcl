# Rendered from profiles/cpu.yaml (profile sha256 10bb8139cedb695c1fa24134452a0ab249e79bd1d3a89dde05a035702d334ef6): pass with -var-file.
tier           = "cpu"
profile_sha256 = "10bb8139cedb695c1fa24134452a0ab249e79bd1d3a89dde05a035702d334ef6"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
