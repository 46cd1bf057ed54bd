# Rendered from profiles/cpu-2node.yaml (profile sha256 2aebf61fd5a102927bdfae6b3861eb047840a2da5a40aa9a1339572c2e400ea3): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "2aebf61fd5a102927bdfae6b3861eb047840a2da5a40aa9a1339572c2e400ea3"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
