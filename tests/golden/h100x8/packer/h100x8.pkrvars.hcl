# Rendered from profiles/h100x8.yaml (profile sha256 d718bb2599a262c4965cf99735e5df99601df56454b6c3b02c3db3a0194ba7b3): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "d718bb2599a262c4965cf99735e5df99601df56454b6c3b02c3db3a0194ba7b3"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
