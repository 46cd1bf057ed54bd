# Rendered from profiles/cpu-2node.yaml (profile sha256 ebeee0ccde67ea1a5d0e2582c4572dc71d9d203015034aa707087eaec64166c1): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "ebeee0ccde67ea1a5d0e2582c4572dc71d9d203015034aa707087eaec64166c1"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
