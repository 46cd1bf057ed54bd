# Rendered from profiles/cpu.yaml (profile sha256 883385f91e3f7c7a4f6562863a99bd6a5b81ea62b916f01cacc405a2d92009bd): pass with -var-file.
tier           = "cpu"
profile_sha256 = "883385f91e3f7c7a4f6562863a99bd6a5b81ea62b916f01cacc405a2d92009bd"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
