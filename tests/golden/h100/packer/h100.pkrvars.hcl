# Rendered from profiles/h100.yaml (profile sha256 8a1ce1ca0a10c30488ba01adce48f94c7f2d9153297a66707c493c44ee21b3d9): pass with -var-file.
tier           = "h100"
profile_sha256 = "8a1ce1ca0a10c30488ba01adce48f94c7f2d9153297a66707c493c44ee21b3d9"
do_size        = "gpu-h100x1-80gb"
do_build_size  = "s-4vcpu-8gb"
do_region      = "tor1"
do_base_image  = "ubuntu-24-04-x64"
vllm_version   = "0.26.0"
