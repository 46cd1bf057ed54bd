# Rendered from profiles/cpu.yaml (profile sha256 52d7dec75a82331e468d5f21589d7712bd951095d74df8d70122353fc57cab57): pass with -var-file.
tier           = "cpu"
profile_sha256 = "52d7dec75a82331e468d5f21589d7712bd951095d74df8d70122353fc57cab57"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = true
