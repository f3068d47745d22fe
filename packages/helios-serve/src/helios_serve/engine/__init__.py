"""Data-only types that cross the boundary between scheduler, worker and runtime."""
