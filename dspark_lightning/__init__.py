"""dspark_lightning: train and study DSpark draft models for speculative decoding with PyTorch Lightning."""

__version__ = "0.1.0"
