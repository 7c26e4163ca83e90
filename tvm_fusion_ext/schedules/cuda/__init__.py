"""CUDA schedule templates."""
