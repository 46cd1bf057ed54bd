# Rendered from profiles/rtx6000ada.yaml (profile sha256 4599e26fab49d224096ec129cc201a6e9fd6938c775ef92a4d73bcbb5bbb2d1b): pass with -var-file.
tier           = "rtx6000ada"
profile_sha256 = "4599e26fab49d224096ec129cc201a6e9fd6938c775ef92a4d73bcbb5bbb2d1b"
do_size        = "gpu-6000adax1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
