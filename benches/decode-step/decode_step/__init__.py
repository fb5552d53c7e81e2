"""The decode-step benchmark (see ../README.md)."""
