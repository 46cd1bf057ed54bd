# Rendered from profiles/cpu-2node.yaml (profile sha256 19d8e4b0215150638d0f03d764bf1372db22babf8c397063345183d7057d65bf): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "19d8e4b0215150638d0f03d764bf1372db22babf8c397063345183d7057d65bf"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
