# Rendered from profiles/l40s.yaml (profile sha256 2c14e1af8ab597cb8061ada1cbe0af3d76160df5449215993f9c86c06dbd428a): pass with -var-file.
tier           = "l40s"
profile_sha256 = "2c14e1af8ab597cb8061ada1cbe0af3d76160df5449215993f9c86c06dbd428a"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
