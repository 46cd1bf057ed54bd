# Rendered from profiles/rtx6000ada.yaml (profile sha256 e6462d1f906a46ede4b1a6f3f49b7cfc7cd59823bb11b31e94b69f0cf67bcb82): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "e6462d1f906a46ede4b1a6f3f49b7cfc7cd59823bb11b31e94b69f0cf67bcb82"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
