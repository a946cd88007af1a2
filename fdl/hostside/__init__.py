"""The code fdl runs on managed hosts: this directory and nothing else.

Every module here is plain Python that runs both in fdl (on the controller box, on a worker under `fdl
join`) and on a managed host inside an Ansible module, where the host has no fdl installed. So here, and
only here:

- the standard library only (pynvml is the one exception: imported as `pynvml` where it is installed, else
  from the packed copy the flodl.fdl collection puts beside this package's files, `..pynvml_packed`);
- Python 3.8 syntax and standard library (the oldest Python ansible-core runs modules on);
- imports within the package are relative, and nothing outside it is imported: a module never knows where
  it was deployed (fdl.hostside here, the collection's module_utils there, `ansible.module_utils.fdl.hostside`
  for a clone used in place).

The rest of fdl imports from here freely; nothing here imports the rest of fdl. tests/unit/hostside/
test_imports.py holds both rules; fdl/collection.py ships every file of this package as the collection's
`plugins/module_utils/<path>`, at the same path (docs/ansible.md, "What the collection carries").

    checks/         the probe: one host's readiness checks (GPU, libtorch, NCCL, data, health, the software
                    stack), its report and verdict, and the node_exporter textfile (checks/probe.py is the
                    entry point `fdl probe` and the fdl_probe module share)
    libtorch/       libtorch's host-side core (what a variant is, where variants live, which one ranks link),
                    which the probe needs; the rest of libtorch (downloads, mirrors, activation, the build
                    environment) is fdl/libtorch/, which imports this
    supervisor.py   the rank supervisor: the launcher's ranks on every host, and `fdl join`'s
    hoststage.py    the launcher's staging layout on a host (the fdl_dispatch_stage module)
    farm/           a farm door's pieces that touch a host: authorized_keys editing, the doors' sshd drop-in,
                    reading sshd's configuration (`fdl join-config` and the fdl_join_door role)
    fsio.py         the one atomic write (temp file, fsync, rename), for fdl and for the code above
    paths.py        every directory fdl keeps something in (~/.flodl/*, the cache, the dataset root), named
                    once: the rest of fdl takes them from here too, and the probe and libtorch's core need them
    envvars.py      the registry of every FDL_* variable (name, meaning, kind, readers), through which all of
                    fdl reads them; here because the probe and libtorch's core read two of them on hosts
    trust.py        whose files fdl believes: git's safe.directory rule for what discovery finds and the project's
                    libtorch/ (the probe loads libraries from it), and the served directory's rule
    redact.py       a URL as a message may show it: without its userinfo
"""
