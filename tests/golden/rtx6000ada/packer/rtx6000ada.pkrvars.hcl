# Rendered from profiles/rtx6000ada.yaml (profile sha256 6a9aa4e92476846967db0da7795ba95e8fd0d16bd56bb610eb30829f69cbfda2): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "6a9aa4e92476846967db0da7795ba95e8fd0d16bd56bb610eb30829f69cbfda2"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
