# Rendered from profiles/rtx6000ada.yaml (profile sha256 66fcdb889c7cb4fae3f0eb383190eba0eb107534d22cecee8ca97a58992694b0): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "66fcdb889c7cb4fae3f0eb383190eba0eb107534d22cecee8ca97a58992694b0"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
