# Rendered from profiles/h100x8.yaml (profile sha256 1695232d55389fda4d19103a1e8465766a9d6fd0195c3fb5ae449ae93357c983): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "1695232d55389fda4d19103a1e8465766a9d6fd0195c3fb5ae449ae93357c983"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
