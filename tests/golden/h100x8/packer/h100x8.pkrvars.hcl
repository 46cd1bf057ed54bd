# Rendered from profiles/h100x8.yaml (profile sha256 81ad3479c467682e31d799e1f4955c2a7249eb02d82dfb68f3f4deb49d3cf00b): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "81ad3479c467682e31d799e1f4955c2a7249eb02d82dfb68f3f4deb49d3cf00b"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
