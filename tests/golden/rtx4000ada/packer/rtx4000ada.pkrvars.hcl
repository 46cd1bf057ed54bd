# Rendered from profiles/rtx4000ada.yaml (profile sha256 64474399ccdbbf716ff1490150e35f4af83519c791cfafe2ff5ac0fb16b30727): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "64474399ccdbbf716ff1490150e35f4af83519c791cfafe2ff5ac0fb16b30727"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
