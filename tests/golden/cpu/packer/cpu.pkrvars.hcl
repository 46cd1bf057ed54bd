# Rendered from profiles/cpu.yaml (profile sha256 3570ad3a58b4fa9e655e4837f1c2b15f14857967d70fad35b1fe4d9d3d4f40bb): pass with -var-file.
tier           = "cpu"
profile_sha256 = "3570ad3a58b4fa9e655e4837f1c2b15f14857967d70fad35b1fe4d9d3d4f40bb"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
