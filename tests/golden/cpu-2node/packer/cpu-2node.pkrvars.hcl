# Rendered from profiles/cpu-2node.yaml (profile sha256 bd804e661694d802a3a65a528a7f47afa1b50626bc9f7c305eee40309e0a15da): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "bd804e661694d802a3a65a528a7f47afa1b50626bc9f7c305eee40309e0a15da"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
