# Rendered from profiles/rtx4000ada.yaml (profile sha256 3f7febd1e0fecf221c9b8368bed9807df3be449af5e44eef2bd8d947f83ab520): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "3f7febd1e0fecf221c9b8368bed9807df3be449af5e44eef2bd8d947f83ab520"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
