# Rendered from profiles/l40s.yaml (profile sha256 75bb4457e77df65506359f015828a774bceb6c244eaaeb87ba11fb556efbcb0a): pass with -var-file.
tier           = "l40s"
profile_sha256 = "75bb4457e77df65506359f015828a774bceb6c244eaaeb87ba11fb556efbcb0a"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
# the build's last command, in the session that powers the machine off (sysprep installs it)
seal_command   = "/usr/local/sbin/inference-seal"
