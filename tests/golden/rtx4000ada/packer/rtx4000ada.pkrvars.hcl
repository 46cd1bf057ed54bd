# Rendered from profiles/rtx4000ada.yaml (profile sha256 cd8e9a21eb29c8255a692c6a23aa0f1cbb90264ab5a77d1a1f0e1fd55f831247): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "cd8e9a21eb29c8255a692c6a23aa0f1cbb90264ab5a77d1a1f0e1fd55f831247"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
