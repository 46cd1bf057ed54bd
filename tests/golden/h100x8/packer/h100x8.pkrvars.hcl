# Rendered from profiles/h100x8.yaml (profile sha256 1dcf03c53cfb7fcba15235af33d1f470183ef2a628c59b6b314afbd88ad9487d): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "1dcf03c53cfb7fcba15235af33d1f470183ef2a628c59b6b314afbd88ad9487d"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
