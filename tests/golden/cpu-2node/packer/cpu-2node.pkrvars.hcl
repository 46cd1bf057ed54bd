# Rendered from profiles/cpu-2node.yaml (profile sha256 5bc88cf265194d05d2fc11fc78d582249385dd1a1027836f2920d848927e6e93): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "5bc88cf265194d05d2fc11fc78d582249385dd1a1027836f2920d848927e6e93"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
