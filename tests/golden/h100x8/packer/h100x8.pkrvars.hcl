# Rendered from profiles/h100x8.yaml (profile sha256 fd09622aec6b2423519f1bada6f65378f33e2dae2dab4f7ec679a3e608d2f2f8): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "fd09622aec6b2423519f1bada6f65378f33e2dae2dab4f7ec679a3e608d2f2f8"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
