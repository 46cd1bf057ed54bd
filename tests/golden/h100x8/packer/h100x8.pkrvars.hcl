# Rendered from profiles/h100x8.yaml (profile sha256 3f79e1855985dfb438d337bbcdf6c3c07ed6b83c6252737c07583d56bd6c23bf): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "3f79e1855985dfb438d337bbcdf6c3c07ed6b83c6252737c07583d56bd6c23bf"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
