"""Extending the project by adding a value, one file each: a format, a device, a kernel's policy, a softmax
variant (docs/design.md, "Where new things go")."""
