# Rendered from profiles/h100x8.yaml (profile sha256 1cf1e1dc31d6fff46217fe27912a35548a4f05c0c468e4474e1f3d24a22446d5): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "1cf1e1dc31d6fff46217fe27912a35548a4f05c0c468e4474e1f3d24a22446d5"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
