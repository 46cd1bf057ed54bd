# Rendered from profiles/h100.yaml (profile sha256 1754f4714d5ae14bb8b66e655333806c467911134f3d6d135a2fb32a2a684230): pass with -var-file.
tier           = "h100"
profile_sha256 = "1754f4714d5ae14bb8b66e655333806c467911134f3d6d135a2fb32a2a684230"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
