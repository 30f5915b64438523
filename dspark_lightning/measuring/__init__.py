"""Measuring a trained drafter, the one home of it: what the ``decode`` and ``calibrate`` commands, the reports and
``SpeculativeDecodingCallback`` all call; the decoding loop it measures lives in ``decoding/``. Speedup, cost model
and ties; tables and intervals; the evaluation sets; identity and the gap; decoding during training; calibration.
Each file's role: docs/api/index.md."""

from dspark_lightning.measuring.cost import best_verify_length, measure_verify_cost
from dspark_lightning.measuring.speedup import measure_speedup

__all__ = ["best_verify_length", "measure_speedup", "measure_verify_cost"]
