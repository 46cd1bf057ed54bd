# Rendered from profiles/h200.yaml (profile sha256 75039e4c6ba46635d2a3794ea7774346285defdaeb985c04b213f48942fee9fb): pass with -var-file.
tier           = "h200"
profile_sha256 = "75039e4c6ba46635d2a3794ea7774346285defdaeb985c04b213f48942fee9fb"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
