class LocalspecError(Exception):
    """A problem the user can act on; the CLI prints it as one line."""
