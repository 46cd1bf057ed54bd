# Rendered from profiles/l40s.yaml (profile sha256 69f1172ce7ffb49976976224e9a4554a294b63e59e9c02c4a98d58d892ce500f): pass with -var-file.
tier           = "l40s"
profile_sha256 = "69f1172ce7ffb49976976224e9a4554a294b63e59e9c02c4a98d58d892ce500f"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
