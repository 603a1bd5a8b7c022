"""Tools for users: the phase-split benchmark client and the launcher."""
