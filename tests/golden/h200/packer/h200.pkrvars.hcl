# Rendered from profiles/h200.yaml (profile sha256 038665bd62545657bda787ae0c41d689c9cfb93196cd3e0a8d7d256940123cc8): pass with -var-file.
tier           = "h200"
profile_sha256 = "038665bd62545657bda787ae0c41d689c9cfb93196cd3e0a8d7d256940123cc8"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
