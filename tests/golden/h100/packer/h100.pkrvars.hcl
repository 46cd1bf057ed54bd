# Rendered from profiles/h100.yaml (profile sha256 0efd2ad4d4df6da304c3cab472ec9c2f178b78bf53877d9c2d4a588e09adaee8): pass with -var-file.
tier           = "h100"
profile_sha256 = "0efd2ad4d4df6da304c3cab472ec9c2f178b78bf53877d9c2d4a588e09adaee8"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
