"""libtorch: the one package for which libtorch a box has, which one ranks link, and getting one.

Its core runs on managed hosts too (the probe needs it), so it lives in the host-side package,
fdl/hostside/libtorch/ (standard library only, Python 3.8, shipped as the collection's module_utils), and
this package imports it from there; nothing there imports this package.

Host-side core (fdl/hostside/libtorch/):

    variants   what a variant is. DOWNLOADS (download name -> directory under a root: cu130 ->
               precompiled/cu130), CHOICES (those and auto), VARIANT_GROUPS, is_variant_name(),
               kind_of() (the one classifier: cpu / cuda / rocm from a variant or directory name),
               label_of(), download_name(), the arch lists (normalise_arch, parse_archs, arch_covers),
               and Libtorch, the one record of a variant directory (kind, vendor, feature, label, to_data).
    resolve    where variants live and which one wins. roots() (project's libtorch/, then ~/.flodl/libtorch:
               the one list of roots), home_root(), home_of(), read_active(), installed_variants(),
               holds_libtorch() (an empty or half-made root is nothing installed), describe_variant()
               (.arch, build-version, the install record), describe_pytorch(), python_torch_dir(),
               resolve_libtorch() (the resolution order), resolution_order(), LibtorchNotFound.

Here, on the controller box and workers (fdl's own imports allowed):

    source     where downloads come from: PyTorch's location for PYTORCH_RELEASE in its own naming, or a
               mirror in either naming; choose_source() (--mirror, FDL_LIBTORCH_MIRROR, libtorch.mirror,
               join.libtorch_mirror), the sha256 pins, route_auto() for `auto`.
    install    ensure_variant(): download, verify (HTTPS, length, pin, every CRC, build-version), unpack,
               record the SHA-256, rename into place, activate; nothing left behind on failure.
    manage     what `fdl libtorch list|info|download|activate` do.
    gate       the libtorch a build links (resolve_active, resolve_variant) and the recipe's environment
               (build_env): the publish gate, the launcher's prebuilds and `fdl join --source`.

The probe's judgement of the resolved libtorch against the GPUs is fdl/hostside/checks/libtorch.py.
"""
