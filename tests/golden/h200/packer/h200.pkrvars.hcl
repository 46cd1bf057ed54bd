# Rendered from profiles/h200.yaml (profile sha256 8ffe63f9cfd79474c2aae86441aacac29ae84ab1cd4978f0cb102cbe73f54a93): pass with -var-file.
tier           = "h200"
profile_sha256 = "8ffe63f9cfd79474c2aae86441aacac29ae84ab1cd4978f0cb102cbe73f54a93"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
