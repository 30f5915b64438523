"""Measuring a trained drafter: the ``decode`` and ``calibrate`` commands and the pieces the reports share with them.

``loading`` (a checkpoint back to module + data), ``decode_tables`` (speculative decoding per mode and schedule),
``validation_blocks`` (the one collector of validation blocks), ``calibration`` (sequential temperature scaling),
``calibration_stats`` (held-out ECE and reliability bins), ``decode_command`` and ``calibrate_command``.
"""
