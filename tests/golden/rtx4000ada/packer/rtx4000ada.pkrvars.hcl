# Rendered from profiles/rtx4000ada.yaml (profile sha256 02d5437901feb6e2c3e24987838ff1651a328a42e5dfe46c43795c89afa63eeb): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "02d5437901feb6e2c3e24987838ff1651a328a42e5dfe46c43795c89afa63eeb"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
