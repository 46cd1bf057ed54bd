# Rendered from profiles/h200.yaml (profile sha256 571970fb6cdd7a8f3984a850823fa6808b3daa105ce4569df1bc64fc8d3928b2): pass with -var-file.
tier           = "h200"
profile_sha256 = "571970fb6cdd7a8f3984a850823fa6808b3daa105ce4569df1bc64fc8d3928b2"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
