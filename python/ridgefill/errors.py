class RidgefillError(Exception):
    """A problem with the user's input or environment, reported as one clear line."""
