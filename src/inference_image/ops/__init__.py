"""Operations against live machines (an image built and booted): bench (vLLM's own `vllm bench
serve` against a machine, and compare), verify (the testinfra suites over SSH or podman), soak
(hours of load, resident memory per minute) and fleet (DigitalOcean droplets from a snapshot).
The build host's package imports none of it to render."""
