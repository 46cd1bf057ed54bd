# Rendered from profiles/rtx6000ada.yaml (profile sha256 75b58ed1814e624eecad487fd8c0f9e9d51fcaa8c20baa503c70c5a3856f50c4): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "75b58ed1814e624eecad487fd8c0f9e9d51fcaa8c20baa503c70c5a3856f50c4"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
