"""The data plane under ``rma.py``: memory views, registered buffers, windows, same-host copies."""
