# Rendered from profiles/cpu-2node.yaml (profile sha256 1218cd9f58be1ab8bed6c0bef2c2332b51dd6d7e2e6c6da148ffabb39be73934): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "1218cd9f58be1ab8bed6c0bef2c2332b51dd6d7e2e6c6da148ffabb39be73934"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
