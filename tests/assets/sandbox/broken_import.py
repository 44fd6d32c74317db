"""A kernel module that fails as soon as it is imported."""

raise RuntimeError("this module is broken on purpose")
