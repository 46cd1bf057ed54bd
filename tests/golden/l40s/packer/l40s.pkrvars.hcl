# Rendered from profiles/l40s.yaml (profile sha256 49c004f95e43c4678e2f0ce4af82e88405a5e22037d7df234afe0483393d9e07): pass with -var-file.
tier           = "l40s"
profile_sha256 = "49c004f95e43c4678e2f0ce4af82e88405a5e22037d7df234afe0483393d9e07"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
