"""The sweep's data types, its records on disk, its errors: the bottom layer, which
imports nothing else of this package and no Ray."""
