# Rendered from profiles/cpu.yaml (profile sha256 a6ae680e7205fc6bb0fc813949f794c6f8a152f174fc8076a5ac201d3a9b6930): pass with -var-file.
tier           = "cpu"
profile_sha256 = "a6ae680e7205fc6bb0fc813949f794c6f8a152f174fc8076a5ac201d3a9b6930"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
