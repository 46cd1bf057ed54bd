# Rendered from profiles/h100x8.yaml (profile sha256 53595fd5c0fa9628a7229c017690c7b1f25fc765c784a57b874bf42860de8158): pass with -var-file.
tier           = "h100x8"
profile_sha256 = "53595fd5c0fa9628a7229c017690c7b1f25fc765c784a57b874bf42860de8158"
do_size        = "gpu-h100x8-640gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
