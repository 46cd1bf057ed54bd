# Rendered from profiles/l40s.yaml (profile sha256 f53c8db96e14497a0f32a63e2b58b78397d73f43e28f1b57aa35e650364c7202): pass with -var-file.
tier           = "l40s"
profile_sha256 = "f53c8db96e14497a0f32a63e2b58b78397d73f43e28f1b57aa35e650364c7202"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
