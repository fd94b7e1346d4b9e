"""One exception type for problems the user can act on: the CLI prints it as one line."""


class SpecdecError(Exception):
    pass
