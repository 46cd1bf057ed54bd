# For current Packer (>= 1.10), which loads builders as plugins: `packer init packer/plugins`.
# Debian's Packer 1.6.6 (bundled builders) rejects this block, so it lives in a directory that
# `packer build packer/` never reads.
packer {
  required_version = ">= 1.6.6"
  required_plugins {
    digitalocean = {
      source  = "github.com/digitalocean/digitalocean"
      version = ">= 1.4.0"
    }
    qemu = {
      source  = "github.com/hashicorp/qemu"
      version = ">= 1.1.0"
    }
    ansible = {
      source  = "github.com/hashicorp/ansible"
      version = ">= 1.1.0"
    }
  }
}
