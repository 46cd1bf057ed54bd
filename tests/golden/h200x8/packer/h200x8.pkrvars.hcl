# Rendered from profiles/h200x8.yaml (profile sha256 9960fb85c92d2c8ed803c323a211ea48e800b9d0106b6538f0d00f8e40793a44): pass with -var-file.
tier           = "h200x8"
profile_sha256 = "9960fb85c92d2c8ed803c323a211ea48e800b9d0106b6538f0d00f8e40793a44"
do_size        = "gpu-h200x8-1128gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
