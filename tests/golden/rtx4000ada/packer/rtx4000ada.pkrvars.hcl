# Rendered from profiles/rtx4000ada.yaml (profile sha256 6a22465774374844611e944a2b028d03b5a751b391ceb270e887e2ed17270e6d): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "6a22465774374844611e944a2b028d03b5a751b391ceb270e887e2ed17270e6d"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
