"""Measuring a trained drafter: the ``decode`` and ``calibrate`` commands and the pieces the reports share with them.

``decode`` and ``calibrate`` (the commands), ``loading`` (a checkpoint back to module + data),
``validation_blocks`` (the one collector of validation blocks), ``calibration`` (sequential temperature scaling) and
``calibration_stats`` (held-out ECE and reliability bins).
"""
