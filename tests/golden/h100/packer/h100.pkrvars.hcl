# Rendered from profiles/h100.yaml (profile sha256 045c0f66f4f105645d8c0a4e6eb3cea10f545cf1545c49465521fe0bde3e8e79): pass with -var-file.
tier           = "h100"
profile_sha256 = "045c0f66f4f105645d8c0a4e6eb3cea10f545cf1545c49465521fe0bde3e8e79"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
