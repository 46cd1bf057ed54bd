# Rendered from profiles/l40s.yaml (profile sha256 19063ef675294c2087949d91fa0cce64c15036cfd5c174f0c5ce7887a4b33dd4): pass with -var-file.
tier           = "l40s"
profile_sha256 = "19063ef675294c2087949d91fa0cce64c15036cfd5c174f0c5ce7887a4b33dd4"
do_size        = "gpu-l40sx1-48gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
# render.serve_during_build: baking on the tier's own machine lets the build start the stack.
serve_during_build = false
