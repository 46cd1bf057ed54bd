# Rendered from profiles/rtx6000ada.yaml (profile sha256 814210ffd1f3a1e2fa6c117186b2cd4a1f56bef33ccc3b4cabc1891b19c91aa8): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "814210ffd1f3a1e2fa6c117186b2cd4a1f56bef33ccc3b4cabc1891b19c91aa8"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
