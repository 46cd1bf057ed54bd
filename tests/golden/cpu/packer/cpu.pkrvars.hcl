# Rendered from profiles/cpu.yaml (profile sha256 5d2c32886fad7869782abda4ee04c9d9928a5091f67452327769bb7241db461d): pass with -var-file.
tier           = "cpu"
profile_sha256 = "5d2c32886fad7869782abda4ee04c9d9928a5091f67452327769bb7241db461d"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
