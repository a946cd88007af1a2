"""fdl.farm code shared with the fdl_join_door modules: the files here are links into the fdl package."""
