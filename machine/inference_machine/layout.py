"""Where things live on the image, and the few names the machine's programs and the build host's
render share. One place: the render writes these into profile.json, the roles and units read
them from the render, the machine's programs from here (and from profile.json for what a
profile decides)."""

from __future__ import annotations

# Where things live on the image. One place, so roles, units and tests agree.
PATHS = {
    "etc": "/etc/inference-image",
    "profile_json": "/etc/inference-image/profile.json",
    "image_json": "/etc/inference-image/image.json",
    "prometheus_targets": "/etc/inference-image/prometheus-targets.json",
    "state": "/var/lib/inference-image",
    "units": "/etc/inference-image/units",
    "api_key": "/etc/inference-image/api-key",
    "api_key_map": "/etc/inference-image/api-key.nginx",
    # the token a remote Prometheus scrapes the public port's /metrics/<target> with (root only,
    # made per machine by firstboot like the API key, and not the API key)
    "scrape_token": "/etc/inference-image/scrape-token",
    # nginx's line an answer of the public port, its HTTP status alone, which mtail counts
    "status_log": "/var/log/inference-image/http-status.log",
    "scrape_token_map": "/etc/inference-image/scrape-token.nginx",
    "models": "/var/lib/inference-image/models",
    "cache": "/var/cache/inference-image",
    "vllm_venv": "/opt/vllm",
    "router_venv": "/opt/vllm-router",
    "runner": "/usr/local/bin/inference-run",
    "firstboot": "/usr/local/sbin/inference-firstboot",
    # the public port's TLS, made per machine by firstboot (user-data may write tls_mode)
    "tls_cert": "/etc/inference-image/tls/cert.pem",
    "tls_key": "/etc/inference-image/tls/key.pem",
    "tls_mode": "/etc/inference-image/tls-mode",
    "public_listen": "/etc/inference-image/public-listen.nginx",
    "endpoint": "/etc/inference-image/endpoint.json",
    # a certificate from an ACME CA (Let's Encrypt) for a domain user-data names in acme_conf
    "acme_conf": "/etc/inference-image/acme",
    "acme_state": "/var/lib/inference-image/acme",
    "acme_run": "/usr/local/sbin/inference-acme",
    # what the build downloads for itself (wheels, the model hub CLI's home and token): sysprep
    # removes it and its check fails an image that still has it
    "build_stage": "/var/tmp/inference-image-build",
    # a fleet droplet's role (router or worker) and its peers, written by user-data (fleet.py)
    "fleet": "/etc/inference-image/fleet.json",
    # a fleet worker registers its instances with the fleet's router (inference-join.timer)
    "join": "/usr/local/sbin/inference-join",
    # the build's last command: SSH host and build keys go, then the power-off (sysprep installs it)
    "seal": "/usr/local/sbin/inference-seal",
    # an instance's start: the warm-cache bundle's check, the page-cache prefetch, the models'
    # inspection at build (inference_machine.cli)
    "startup": "/usr/local/sbin/inference-startup",
    # the machine's runtime (this package, machine/ in the source tree): a virtualenv of the
    # system's Python whose console scripts RUNTIME_PROGRAMS (below) name, linked at their paths
    "runtime_venv": "/opt/inference-machine",
    # an instance written to disk once it served, restored instead of started again
    # (inference_machine.checkpoint, root only): one folder per instance
    "checkpoints": "/var/lib/inference-image/checkpoints",
    # a start's word from its checkpoint helper to its main process, and its gate's flag
    # (inference_machine.unit_checkpoint)
    "checkpoint_run": "/run/inference-image/checkpoint",
    # CRIU, built from Debian's source of the pinned release (scripts/build-criu)
    "criu": "/usr/local/sbin/criu",
}
# the machine's runtime's programs: console scripts in PATHS["runtime_venv"]/bin, each linked at
# its path here (the inference_service role links them; the smoke suite checks the links)
RUNTIME_PROGRAMS = ("runner", "firstboot", "acme_run", "join", "startup")
# a fleet worker's instance that is leaving its router (a file named by its port, from its
# ExecStop until its next start): the join timer must not add it back while it drains. Beside the
# caches because the service user writes it.
PATHS["leaving"] = PATHS["cache"] + "/leaving"
# The nftables table the firewall role writes; inference-acme opens port 80 in it while a CA checks
# the machine (HTTP-01), and only then.
FIREWALL_TABLE = "inference_image"

# the router's definition on a fleet's router droplet (vllm-router.service runs it there)
FLEET_ROUTER_UNIT = "router-fleet"
# an instance's definition on a node of a multi-node instance (inference-run runs it there): its
# pipeline stage, headless
NODE_UNIT_SUFFIX = "-node"
