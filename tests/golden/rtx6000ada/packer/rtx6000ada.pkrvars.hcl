# Rendered from profiles/rtx6000ada.yaml (profile sha256 2b514a1deca892ba9b9d87731202281a40e5deb6158e8ece7852b899b63ff5d7): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "2b514a1deca892ba9b9d87731202281a40e5deb6158e8ece7852b899b63ff5d7"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
