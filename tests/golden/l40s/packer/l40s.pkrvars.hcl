# Rendered from profiles/l40s.yaml (profile sha256 d41a42ec0b0e78b3c9a85f72ff37d62a7f9011d0208d3c7fd072c2eab951b39b): pass with -var-file.
tier           = "l40s"
profile_sha256 = "d41a42ec0b0e78b3c9a85f72ff37d62a7f9011d0208d3c7fd072c2eab951b39b"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
