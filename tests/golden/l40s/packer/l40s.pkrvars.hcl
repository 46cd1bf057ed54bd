# Rendered from profiles/l40s.yaml (profile sha256 e3b2f20bbec4cd58522abbefa877003cdecb2bfdfb000a1a6b4758d0885ef44b): pass with -var-file.
tier           = "l40s"
profile_sha256 = "e3b2f20bbec4cd58522abbefa877003cdecb2bfdfb000a1a6b4758d0885ef44b"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# Baking on the tier's own machine lets the build start the stack (and warm the compile cache).
serve_during_build = false
