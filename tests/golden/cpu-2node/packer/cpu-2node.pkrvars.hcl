# Rendered from profiles/cpu-2node.yaml (profile sha256 78ae5c8117769f572e5513267e99584b22bdc9e301fc6d1ca5eb115d594367b5): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "78ae5c8117769f572e5513267e99584b22bdc9e301fc6d1ca5eb115d594367b5"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
