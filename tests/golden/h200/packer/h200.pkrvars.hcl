# Rendered from profiles/h200.yaml (profile sha256 51fa75a452c2063bb5ac03a53da0236eea5e20003da5a40d04f8677bdfb4c5ae): pass with -var-file.
tier           = "h200"
profile_sha256 = "51fa75a452c2063bb5ac03a53da0236eea5e20003da5a40d04f8677bdfb4c5ae"
do_size        = "gpu-h200x1-141gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
