# Rendered from profiles/rtx4000ada.yaml (profile sha256 4dfff9c2ee9d75080d8874030e284ed3c171054db631910286c9c72c66e183d2): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "4dfff9c2ee9d75080d8874030e284ed3c171054db631910286c9c72c66e183d2"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
