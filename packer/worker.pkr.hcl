# Bake an fdl worker image: Packer's ansible provisioner runs the flodl.fdl collection's join_worker
# playbook (the fdl_join_worker role) on the machine being built, with the unit enabled but not started (no
# systemd runs during a bake), so the image boots straight into `fdl join --persist`.
# docs/images.md walks through it.
#
#   packer build -var ssh_host=10.0.0.5 -var ssh_private_key_file=$HOME/.ssh/id_ed25519 \
#       -var fdl_wheel=$PWD/dist/fdl-0.1.0-py3-none-any.whl -var join_vars=$PWD/worker-vars.yml \
#       -var collections="$(python -m fdl.resources)" \
#       packer/worker.pkr.hcl
#
# The source below is `null`: it provisions a machine that already runs (a VM you snapshot
# yourself, or a test host). For a cloud image, replace it with your builder (amazon-ebs,
# googlecompute, qemu, ...) and keep the build block as it is.
#
# Packer 1.6 to 1.9 carry the ansible provisioner built in. Packer 1.10 and later need the
# plugin: add this block (which 1.6 does not understand) and run `packer init`:
#
#   packer {
#     required_plugins {
#       ansible = {
#         source  = "github.com/hashicorp/ansible"
#         version = ">= 1.1.0"
#       }
#     }
#   }

variable "ssh_host" {
  type        = string
  description = "Address of the machine being provisioned."
}

variable "ssh_port" {
  type        = number
  default     = 22
  description = "Its SSH port."
}

variable "ssh_username" {
  type        = string
  default     = "root"
  description = "The account Packer and Ansible log in as."
}

variable "ssh_private_key_file" {
  type        = string
  description = "The private key they log in with (a file on this machine)."
}

variable "ssh_known_hosts" {
  type        = string
  default     = "/dev/null"
  description = "A known_hosts file Ansible checks the machine's host key against; the default records and checks nothing, as Packer's own SSH connection does (a build VM has fresh host keys every time)."
}

variable "become" {
  type        = bool
  default     = true
  description = "Run the role with become (sudo); false when ssh_username may write every path itself."
}

variable "fdl_wheel" {
  type        = string
  default     = ""
  description = "An fdl wheel on this machine to install from; empty: the index (fdl_join_worker_package)."
}

variable "collections" {
  type        = string
  description = "A collections path holding flodl.fdl: `python -m fdl.resources` prints fdl's own, or wherever ansible-galaxy installed the tarball."
}

variable "join_vars" {
  type        = string
  description = "A YAML or JSON file of fdl_join_worker_* variables (the join block, token, paths); read with -e @file, so no secret reaches a command line."
}

locals {
  # fdl's shipped files: this template sits in packer/ next to ansible.cfg.
  share = "${path.root}/.."
  wheel_vars = var.fdl_wheel == "" ? [] : [
    "--extra-vars", jsonencode({ fdl_join_worker_install_from = "wheel", fdl_join_worker_wheel = var.fdl_wheel }),
  ]
}

source "null" "worker" {
  communicator         = "ssh"
  ssh_host             = var.ssh_host
  ssh_port             = var.ssh_port
  ssh_username         = var.ssh_username
  ssh_private_key_file = var.ssh_private_key_file
}

build {
  sources = ["source.null.worker"]

  provisioner "ansible" {
    playbook_file = "${var.collections}/ansible_collections/flodl/fdl/playbooks/join_worker.yml"
    # Ansible dials the machine itself (the communicator's address, user and key), not through Packer.
    use_proxy = false
    user      = var.ssh_username
    extra_arguments = concat(
      var.become ? ["--become"] : [],
      ["--ssh-common-args", "-o UserKnownHostsFile=${var.ssh_known_hosts}"],
      ["--extra-vars", "@${var.join_vars}"],
      local.wheel_vars,
      # An image build: install and enable, never start (no systemd runs while baking).
      ["--extra-vars", jsonencode({ fdl_join_worker_start = false })],
    )
    ansible_env_vars = [
      "ANSIBLE_CONFIG=${local.share}/ansible.cfg",
      "ANSIBLE_COLLECTIONS_PATH=${var.collections}",
      "ANSIBLE_PYTHON_INTERPRETER=/usr/bin/python3",
    ]
  }
}
