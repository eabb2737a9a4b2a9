"""One process's runtime, the same on every rank: protocol, dispatch, ports, actors, progress."""
