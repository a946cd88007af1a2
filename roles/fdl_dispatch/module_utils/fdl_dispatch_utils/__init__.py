"""fdl code the fdl_dispatch role ships to hosts (symlinks into the fdl package: the same files, not copies)."""
