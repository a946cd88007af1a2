"""Configuration: fdl.yml discovery, env overlays, deep merge, provenance, schema.

Import each name from the module that defines it (`fdl.config.project.load_config`,
`fdl.config.discover.find_base`, `fdl.config.schema.CommandSpec`...): the package
itself exports nothing, so a caller pays only for the modules it names.

This package, fdl.cluster.inventory and what they import (fdl.errors, fdl.fsio, fdl.checks.devices,
fdl.libtorch's variants and source) are the configuration reader the flodl.fdl collection's inventory plugin
carries (fdl/collection.py, READER): they import one another relatively and need nothing beyond the standard
library and PyYAML.
"""
