# Rendered from profiles/cpu.yaml (profile sha256 690f79c14f696e031e82434309c353cffbe2a8aeee531459c5d4d3d9adbe1f9c): pass with -var-file.
tier           = "cpu"
profile_sha256 = "690f79c14f696e031e82434309c353cffbe2a8aeee531459c5d4d3d9adbe1f9c"
do_size        = "s-4vcpu-16gb-amd"
do_build_size  = "s-4vcpu-16gb-amd"
do_region      = "tor1"
do_base_image  = "debian-12-x64"
vllm_version   = "0.32.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = true
