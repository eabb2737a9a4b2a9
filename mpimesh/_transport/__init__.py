"""Frames over MPI: the MPI library handle, the router and its native twin, doorbells."""
