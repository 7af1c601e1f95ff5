"""The Ray engine: the only package that imports Ray."""
