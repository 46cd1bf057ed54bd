# Rendered from profiles/h100x8.yaml (profile sha256 8c0cc87ac0216530678f6b5e011fb2f1c5bde208fb477e48ffbaca57b327617e): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "8c0cc87ac0216530678f6b5e011fb2f1c5bde208fb477e48ffbaca57b327617e"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
