# Rendered from profiles/l40s.yaml (profile sha256 fdb5015e2473266744cb54c8090fced23caf3f52f61f1a7f4014e0cee96086db): pass with -var-file.
tier           = "l40s"
profile_sha256 = "fdb5015e2473266744cb54c8090fced23caf3f52f61f1a7f4014e0cee96086db"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
