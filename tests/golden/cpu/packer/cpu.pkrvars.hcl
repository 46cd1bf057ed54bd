# Rendered from profiles/cpu.yaml (profile sha256 b92ec37ef764ffd529b6dc8e4efe880fe13899be86e78764f2719c73bb02a5f8): pass with -var-file.
tier           = "cpu"
profile_sha256 = "b92ec37ef764ffd529b6dc8e4efe880fe13899be86e78764f2719c73bb02a5f8"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
