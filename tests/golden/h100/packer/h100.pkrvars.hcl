# Rendered from profiles/h100.yaml (profile sha256 6494d9787c5e990573e2f9cfe2a257cb911b63ee2a13696645e812678ae534fa): pass with -var-file.
tier           = "h100"
profile_sha256 = "6494d9787c5e990573e2f9cfe2a257cb911b63ee2a13696645e812678ae534fa"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
