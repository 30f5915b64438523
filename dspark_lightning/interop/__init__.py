"""Other tools' formats: the speculators DSpark format (``speculators_format``) and its DFlash form
(``dflash_format``), loading such a directory (``speculators_load``), exporting a checkpoint to it (``export``, the
``export`` command), which head each engine serves (``support_matrix``), checking an export against the speculators
library (``speculators_parity``) and against vLLM (``serve_check``, the ``serve-check`` command; ``vllm_worker`` is
its vLLM side), and materialising a GGUF target as a Hugging Face directory (``import_gguf``, the ``import-gguf``
command: import its functions from that module, whose name is also its main function's)."""

from dspark_lightning import lazy_exports

_EXPORTS = {
    "CONFIG_NAME": "dspark_lightning.interop.speculators_format",
    "EXPORT_DTYPES": "dspark_lightning.interop.speculators_format",
    "WEIGHTS_NAME": "dspark_lightning.interop.speculators_format",
    "build_config": "dspark_lightning.interop.speculators_format",
    "drafter_configs": "dspark_lightning.interop.speculators_format",
    "markov_head_config": "dspark_lightning.interop.speculators_format",
    "load_exported": "dspark_lightning.interop.speculators_load",
    "read_exported": "dspark_lightning.interop.speculators_load",
    "export_checkpoint": "dspark_lightning.interop.export",
    "export_command": "dspark_lightning.interop.export",
    "export_drafter": "dspark_lightning.interop.export",
    "exported_tensors": "dspark_lightning.interop.export",
    "read_checkpoint": "dspark_lightning.interop.export",
    "SUPPORT": "dspark_lightning.interop.support_matrix",
    "check_servable": "dspark_lightning.interop.support_matrix",
    "head_kind": "dspark_lightning.interop.support_matrix",
    "serve_check_command": "dspark_lightning.interop.serve_check",
}
__all__ = sorted(_EXPORTS)

# so reading the format or importing a GGUF does not pull in Lightning (``export`` does)
__getattr__ = lazy_exports(__name__, _EXPORTS)
