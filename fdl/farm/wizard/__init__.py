"""`fdl join-config`: everything a farm needs, in one pass on the controller box.

Four parts, each doing one thing, so that nothing is written before every question is answered and the
host doctor has spoken:

- shape.py: the command line, the farm's own worker yml and a person's answers turned into the farm's
  checked shape (door, controller address, ports, what it serves);
- plan.py: `prepare()` settles the farm's place and credentials, plans the sshd drop-in, reads the door's
  host keys, observes the host and reads the key file, into a frozen `Plan`; decide.py: `decide()` takes the
  key file's decisions (consent, permissions) into a frozen `Decisions`. A decision needed without a
  terminal is a refusal;
- apply.py: `apply()` has the roles render every file of the farm (files.py: the variables the render play
  is given and what each file must read back as; fdl.farm.render runs it), checks them, and only then writes
  the farm's own files (directory, credentials, worker yml, known_hosts, the review copies of the drop-in and
  the key line, cloud-init, self-test, the overlay, created or moved off a literal token) and, with consent,
  has the key line put into the key file by the fdl_join_door role (role.py: ansible-playbook on this box,
  the same tasks an Ansible user runs); the privileged part of the door (drop-in, reload, door a's jail) it
  leaves to one printed `ansible-playbook ... --become` line; steps.py composes the setup steps;
- report.py: what was done, as typed records (`FarmReport`), with their JSON twin.

The library never prints: questions go through a `Prompter` the caller supplies, results come back as
records the CLI renders (fdl/cli/join_config.py). Each name is imported from the module that defines it.
"""
