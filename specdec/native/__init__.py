"""A forward of our own for the served architectures (issue #42): row-exact C++ ops (ops.py) and the model on them."""
