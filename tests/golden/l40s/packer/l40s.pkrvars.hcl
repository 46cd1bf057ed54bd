# Rendered from profiles/l40s.yaml (profile sha256 697d47393c2c2b31d5c88c941f2b50db047cd1dfc99d8b897ce3c8ce3b6003a7): pass with -var-file.
tier           = "l40s"
profile_sha256 = "697d47393c2c2b31d5c88c941f2b50db047cd1dfc99d8b897ce3c8ce3b6003a7"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
