# Rendered from profiles/cpu.yaml (profile sha256 8befff833f47fbc10a7a15f7452815224dffd99d3f35c7bb71bcb5e55699e384): pass with -var-file.
tier           = "cpu"
profile_sha256 = "8befff833f47fbc10a7a15f7452815224dffd99d3f35c7bb71bcb5e55699e384"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
