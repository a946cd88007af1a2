"""Configuration: fdl.yml discovery, env overlays, deep merge, provenance, schema.

Import each name from the module that defines it (`fdl.config.project.load_config`,
`fdl.config.discover.find_base`, `fdl.config.schema.CommandSpec`...): the package
itself exports nothing, so a caller pays only for the modules it names.
"""
