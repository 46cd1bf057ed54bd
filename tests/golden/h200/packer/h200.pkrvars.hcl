# Rendered from profiles/h200.yaml (profile sha256 3410013158a7a51b1e3e794469f51027396f8082feff167ff77f6bc7cead6144): pass with -var-file.
tier           = "h200"
profile_sha256 = "3410013158a7a51b1e3e794469f51027396f8082feff167ff77f6bc7cead6144"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
