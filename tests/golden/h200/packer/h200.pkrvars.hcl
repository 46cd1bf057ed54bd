# Rendered from profiles/h200.yaml (profile sha256 f8354e67bfef6347adfd2db7e76b7d976a717b1e41ea4b6e41da6e117af49e28): pass with -var-file.
tier           = "h200"
profile_sha256 = "f8354e67bfef6347adfd2db7e76b7d976a717b1e41ea4b6e41da6e117af49e28"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
