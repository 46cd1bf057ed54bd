# Rendered from profiles/h100.yaml (profile sha256 7e4fae48d0d4132f88484d7fb1f97b122e4de38995ec5289d143e0eae198941f): pass with -var-file.
tier           = "h100"
profile_sha256 = "7e4fae48d0d4132f88484d7fb1f97b122e4de38995ec5289d143e0eae198941f"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
