"""The parts of a farm door that run on a managed host (the rest of `fdl join-config` is fdl/farm/)."""
