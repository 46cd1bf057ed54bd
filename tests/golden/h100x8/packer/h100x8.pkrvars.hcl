# Rendered from profiles/h100x8.yaml (profile sha256 354f1d3d7800c6af3fac6315a45b84d25fe83b7bbf82c6d203c137fcc9d00719): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "354f1d3d7800c6af3fac6315a45b84d25fe83b7bbf82c6d203c137fcc9d00719"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
