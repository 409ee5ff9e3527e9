"""Readers and writers of model files: safetensors in, burnpack out."""
