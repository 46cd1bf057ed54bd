# Rendered from profiles/rtx4000ada.yaml (profile sha256 c9ed6e6acde974367a051d1569ab0c9bfd704a76288adae22ba711d05ec9becc): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "c9ed6e6acde974367a051d1569ab0c9bfd704a76288adae22ba711d05ec9becc"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
