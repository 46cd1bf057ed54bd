# Rendered from profiles/h100.yaml (profile sha256 d83f87ba53cc84b9e20bc42e282efa185cba3bde978f60a7b52cb223033089bc): pass with -var-file.
tier           = "h100"
profile_sha256 = "d83f87ba53cc84b9e20bc42e282efa185cba3bde978f60a7b52cb223033089bc"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
