# Rendered from profiles/rtx4000ada.yaml (profile sha256 67efe815bb932c6779db9c9a389217c71ee12587e2d62025bd776c6859baac88): pass with -var-file.
tier           = "rtx4000ada"
profile_sha256 = "67efe815bb932c6779db9c9a389217c71ee12587e2d62025bd776c6859baac88"
do_size        = "gpu-4000adax1-20gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
