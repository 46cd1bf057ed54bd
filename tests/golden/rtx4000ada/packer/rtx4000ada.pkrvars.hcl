# Rendered from profiles/rtx4000ada.yaml (profile sha256 30608d048e8b9e5ccec659a114eadb8d005909b2a30a2a9f3f2896caf15fbff0): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "30608d048e8b9e5ccec659a114eadb8d005909b2a30a2a9f3f2896caf15fbff0"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
