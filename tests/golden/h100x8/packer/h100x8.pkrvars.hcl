# Rendered from profiles/h100x8.yaml (profile sha256 adb2c60443aa2c62ee098fde4f98930a65c75e061267d55d5123430d9badcc3c): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "adb2c60443aa2c62ee098fde4f98930a65c75e061267d55d5123430d9badcc3c"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
