# Rendered from profiles/cpu-2node.yaml (profile sha256 082c19c0187043244ebbb0b3e7ccf460c6bc63d3babf4997d8c1334fb022448c): pass with -var-file.
tier           = "cpu-2node"
profile_sha256 = "082c19c0187043244ebbb0b3e7ccf460c6bc63d3babf4997d8c1334fb022448c"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
