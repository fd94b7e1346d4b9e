"""specdec's own CPU code: kernel builds (build.py), row-exact C++ ops (ops.py) and the native forward (issue #42)."""
