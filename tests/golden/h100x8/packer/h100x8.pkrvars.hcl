# Rendered from profiles/h100x8.yaml (profile sha256 8406a9ea537177ca3fb2b942bbde07a32351c0d11f0a06456da7e632fc3ad959): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "8406a9ea537177ca3fb2b942bbde07a32351c0d11f0a06456da7e632fc3ad959"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
