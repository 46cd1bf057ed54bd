# Rendered from profiles/rtx6000ada.yaml (profile sha256 1993f6215aa5ad43f0689beb11ddf7f08caf7a7290f5114150379318d01b68c1): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "1993f6215aa5ad43f0689beb11ddf7f08caf7a7290f5114150379318d01b68c1"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
