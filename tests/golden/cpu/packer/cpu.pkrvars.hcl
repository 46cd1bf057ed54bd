# Rendered from profiles/cpu.yaml (profile sha256 4102ae70d90faa29ae807c6d8d3bf94ddb6ddbeb50d484c7e588e221bb371fb6): pass with -var-file.
tier           = "cpu"
profile_sha256 = "4102ae70d90faa29ae807c6d8d3bf94ddb6ddbeb50d484c7e588e221bb371fb6"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
