# Rendered from profiles/rtx4000ada.yaml (profile sha256 339b09be30e0e1671b23c7675b6f778bd4680f41b69c3e0f97ef840e7c480383): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "339b09be30e0e1671b23c7675b6f778bd4680f41b69c3e0f97ef840e7c480383"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
