"""Publishing a run: source specs, the build gate, the run manifest (see docs/publish.md).

Modules:
    spec      parse_source_spec() -> FileSource | RsyncSource | GitSource; SourceSpecError
    manifest  Manifest, read_manifest(), write_manifest(), remove_manifest(); ManifestMissing, ManifestError
    fetch     materialize() (source -> local tree, incremental), pull_run() (a worker fetching a published run)
    libtorch  the controller's libtorch and the environment a build recipe gets
    gate      the build gate and --gate check-builds, vendor header checks
    run       fdl publish itself: resolve_request(), publish() -> PublishResult
    report    worker_sources(): how workers pull a published run (fdl.cli.render.publish renders the report)

Nothing here imports ansible, requests or pynvml.
"""
