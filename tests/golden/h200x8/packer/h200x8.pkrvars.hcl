# Rendered from profiles/h200x8.yaml (profile sha256 8c33ac7b450f4bd6b133d344c44f3379739f17166bb34719ae6b1325c2cccb5a): pass with -var-file.
tier           = "h200x8"
profile_sha256 = "8c33ac7b450f4bd6b133d344c44f3379739f17166bb34719ae6b1325c2cccb5a"
do_size        = "gpu-h200x8-1128gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
