# Rendered from profiles/h200.yaml (profile sha256 5f29c3f7ced04c4117d23866203694c66ffcc7d6f0022c34aecc9d7e178fa9c8): pass with -var-file.
tier           = "h200"
profile_sha256 = "5f29c3f7ced04c4117d23866203694c66ffcc7d6f0022c34aecc9d7e178fa9c8"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
