# Rendered from profiles/h100.yaml (profile sha256 875b3bfa2c4616478f694953bfcc2372ccc0a8ed92c45d605f609af88b07d5e1): pass with -var-file.
tier           = "h100"
profile_sha256 = "875b3bfa2c4616478f694953bfcc2372ccc0a8ed92c45d605f609af88b07d5e1"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
