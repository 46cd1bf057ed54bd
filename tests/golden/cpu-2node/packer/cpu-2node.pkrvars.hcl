# Rendered from profiles/cpu-2node.yaml (profile sha256 4ddb608d45d54290dcfb9b39355eba755fa4a91927d6d74d2fbb8b3da6f7b361): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "4ddb608d45d54290dcfb9b39355eba755fa4a91927d6d74d2fbb8b3da6f7b361"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
