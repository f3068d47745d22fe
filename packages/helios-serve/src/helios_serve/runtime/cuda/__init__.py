"""CUDA driver helpers for the cuda backend (cuda-python driver API only; no torch)."""
