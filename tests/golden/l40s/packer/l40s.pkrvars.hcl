# Rendered from profiles/l40s.yaml (profile sha256 dc74fb4062af8ccc7ab6f618d46105b69e1c11570dec216fbc1a588fd90ea9e6): pass with -var-file.
tier           = "l40s"
profile_sha256 = "dc74fb4062af8ccc7ab6f618d46105b69e1c11570dec216fbc1a588fd90ea9e6"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
