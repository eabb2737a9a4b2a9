"""What differs between rank 0 (the controller) and the other ranks (workers): boot, liveness, exit."""
