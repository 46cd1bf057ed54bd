# Rendered from profiles/h100x8.yaml (profile sha256 752e88b0319594a81d3f9dc7e87b3554eafb829e9f6d652d75498de2472f1a7e): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "752e88b0319594a81d3f9dc7e87b3554eafb829e9f6d652d75498de2472f1a7e"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
