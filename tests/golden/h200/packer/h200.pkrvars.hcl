# Rendered from profiles/h200.yaml (profile sha256 18f37aa5eab70154d744b76d944818bca06bb4e7db54b61489e20c171084a5b3): pass with -var-file.
tier           = "h200"
profile_sha256 = "18f37aa5eab70154d744b76d944818bca06bb4e7db54b61489e20c171084a5b3"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
