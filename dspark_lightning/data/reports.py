"""What the data module reports about its passes: counters per split, the log line after each pass, the summary at
``teardown`` and the error of a pass that yields nothing (a mixin of ``ShareGPTDataModule``, kept apart so the data
module stays readable; it uses the module's ``_counts``, ``_source`` and data options)."""

from __future__ import annotations

import logging

from dspark_lightning.data.accounting import COUNTER_NAMES, NoTrainableDataError
from dspark_lightning.data.sharegpt import BAD_RECORD_REASONS

# the data module's logger: these are its reports (tests and users filter on that name)
logger = logging.getLogger("dspark_lightning.data.datamodule")


class DataReports:
    """Counters and reports of ``ShareGPTDataModule`` (see the module docstring)."""

    def teardown(self, stage: str) -> None:
        """Summarise the skipped records of every split read in this stage (its last or current pass)."""
        for split in self._counts:
            stats, bad = self.data_stats(split), self.bad_record_counts(split)
            stage_name = getattr(stage, "value", stage)  # Lightning passes a str enum
            summary = f"{stage_name} finished; {split} data: {stats['records']} records read in the last pass"
            if bad:
                logger.warning("%s, %d skipped: %s", summary, sum(bad.values()), bad)
            else:
                logger.info("%s, none skipped", summary)

    def data_stats(self, split: str = "train") -> dict[str, int]:
        """All counters of the last (or current) pass over ``split`` on this rank, summed over workers."""
        counts = self._counts.get(split)
        return counts.totals() if counts is not None else dict.fromkeys(COUNTER_NAMES, 0)

    def bad_record_counts(self, split: str = "train") -> dict[str, int]:
        """Skipped records by reason (non-zero reasons only) for the last pass over ``split`` on this rank."""
        stats = self.data_stats(split)
        return {reason: stats[reason] for reason in BAD_RECORD_REASONS if stats[reason]}

    def log_data_stats(self, split: str) -> None:
        """Log the counters of the pass that just ended (a warning the first time records were skipped); a pass
        without a single row is a :class:`NoTrainableDataError` naming the skip reasons."""
        stats = self.data_stats(split)
        bad = self.bad_record_counts(split)
        if stats["rows"] == 0:
            raise NoTrainableDataError(self.no_rows_message(split))
        summary = (
            f"{split} data pass: {stats['records']} records -> {stats['documents']} conversations "
            f"({stats['truncated_documents']} truncated) -> {stats['rows']} rows of {self.seq_len} tokens"
        )
        if bad and split not in self._warned_skips:
            self._warned_skips.add(split)  # once per split: the same skips recur every epoch
            logger.warning("%s; skipped %d bad records: %s", summary, sum(bad.values()), bad)
        else:
            logger.info("%s; skipped %d bad records: %s", summary, sum(bad.values()), bad)

    def no_rows_message(self, split: str) -> str:
        """Why the last pass over ``split`` produced nothing: skip counts by reason, the options and files involved."""
        stats, bad = self.data_stats(split), self.bad_record_counts(split)
        source = self._source(split)
        where = source.describe() if source.is_hub else ", ".join(source.files[:4]) + (" ..." * (len(source.files) > 4))
        if not stats["records"]:
            return f"{split} data yielded no records at all (empty files?): {where}"
        reasons = "; ".join(f"{reason}: {count} ({BAD_RECORD_REASONS[reason]})" for reason, count in bad.items())
        return (
            f"{split} data yielded no trainable row: all {stats['records']} records were skipped ({reasons}); "
            f"data.seq_len={self.seq_len}, data.max_length={self.max_length}, "
            f"data.min_supervised_tokens={self.min_supervised_tokens}, block_size={self.block_size}, "
            f"data.format={self.data_format.format}; files: {where}"
        )
