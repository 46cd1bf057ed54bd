# Inputs. Tier values come from the render (build/<tier>/packer/<tier>.pkrvars.hcl, via -var-file);
# the Makefile passes the paths. Works with Debian's Packer 1.6.6 and with current Packer
# (plugins: `packer init packer/plugins`, a directory 1.6.6 never reads).

variable "tier" {
  type = string
}

variable "profile_sha256" {
  type = string
}

variable "vllm_version" {
  type = string
}

variable "do_size" {
  type        = string
  description = "the droplet size the image is for"
}

variable "do_build_size" {
  type        = string
  description = "the droplet size that bakes it (a CPU droplet when the tier bakes without a GPU)"
}

variable "do_region" {
  type = string
}

variable "do_base_image" {
  type = string
}

variable "digitalocean_token" {
  type      = string
  default   = env("DIGITALOCEAN_TOKEN")
  sensitive = true
}

variable "image_version" {
  type        = string
  description = "the project's version, part of the snapshot name <tier>-<version>-<date>"
}

variable "snapshot_name" {
  type        = string
  default     = ""
  description = "override the name <tier>-<version>-<date>"
}

variable "project_dir" {
  type = string
}

variable "render_dir" {
  type        = string
  description = "inference-image render output for this tier"
}

variable "output_dir" {
  type        = string
  description = "where the image, manifest, version info and validation report go"
}

variable "ssh_private_key_file" {
  type        = string
  description = "the build's own SSH key (the Makefile makes one per build)"
}

variable "user_data_file" {
  type        = string
  description = "cloud-init user-data with the build key (DigitalOcean user_data; the qemu seed)"
}

variable "seal_command" {
  type        = string
  description = "removes the SSH host and build keys, then runs its arguments (the power-off); from the render"
}

variable "serve_during_build" {
  type        = bool
  description = "start the stack while baking (warms the compile cache; false when baking without the tier's GPU)"
}

variable "ansible_extra_vars" {
  type        = list(string)
  default     = []
  description = "more -e KEY=VALUE for the playbook, e.g. offline wheel directories"
}

variable "warm_cache" {
  type        = string
  default     = ""
  description = "a warm-cache bundle on this machine (inference-startup make, the lab's ready step) the image's instances start from; empty: none"
}

variable "http_wheel_dirs" {
  type        = map(string)
  default     = {}
  description = <<-EOT
    offline wheelhouses the qemu build installs from Packer's HTTP server instead of copying them
    over SSH: a role variable (vllm_wheel_dir, inference_service_router_wheel_dir) to a path under
    the HTTP directory; the playbook gets http://HTTP_ADDR/PATH/ and VARIABLE_remote=true
  EOT
}

variable "qemu_base_image" {
  type        = string
  default     = ""
  description = "Debian 12 qcow2 from scripts/make-base-image"
}

variable "qemu_memory" {
  type    = number
  default = 8192
}

variable "qemu_disk_size" {
  type        = string
  default     = "16G"
  description = "virtual size of the local image's disk (the qcow2 file only holds what is written)"
}

variable "qemu_cpus" {
  type    = number
  default = 2
}

variable "verify_wait_s" {
  type        = number
  default     = 2400
  description = "how long validation waits for the stack after the reboot (software emulation is slow)"
}
