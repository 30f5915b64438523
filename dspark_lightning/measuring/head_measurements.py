"""Every number the reports measure on a trained drafter: teacher-forced and measured tau, Selector agreement and
coverage, held-out calibration (shared by the demo report, the recipe report and the loss study)."""

from __future__ import annotations

from dspark_lightning.decoding import supported_modes
from dspark_lightning.measuring.calibration import heldout_calibration
from dspark_lightning.measuring.tables import measured_decoding
from dspark_lightning.measuring.validation_blocks import collect_blocks
from dspark_lightning.selector import equivalence_report

SELECTOR_KS = (1, 2, 4, 8, 16, 32, 64)


def evaluate_variant(module, datamodule, *, num_prompts: int, max_new_tokens: int, k: int, max_blocks: int) -> dict:
    """Every report number for a trained module: the last validation's teacher-forced numbers, greedy speculative
    decoding on the eval prompts, the Selector walk against the sequential decode and held-out calibration."""
    module.eval()
    head = module.drafter.markov_head
    values = module.last_validation
    result: dict = {
        "teacher_tau": float(values["acceptance/tau"]),
        "teacher_greedy_tau": float(values["acceptance/greedy_tau"]),
        "accept_rate_per_slot": [float(v) for v in values["acceptance/accept_rate_per_slot"].tolist()],
        "greedy_acc_per_slot": [float(v) for v in values["acceptance/greedy_acc_per_slot"].tolist()],
    }
    selector_form = "selector" in supported_modes(head)
    # with a head, the Markov modes only (parallel is then the same drafter without its head)
    modes = [m for m in supported_modes(head) if head is None or m != "parallel"]
    prompts = datamodule.eval_prompts()[:num_prompts]
    decoded = measured_decoding(module, prompts, modes, max_new_tokens, k)
    result["measured_tau"] = decoded[modes[0]].tau
    result["measured_mode"] = modes[0]
    result["measured_selector_tau"] = decoded["selector"].tau if "selector" in decoded else None
    result["measured_accepted_per_slot"] = decoded[modes[0]].accepted_rate_per_slot
    result["num_prompts"] = len(prompts)

    blocks = collect_blocks(module, datamodule.val_dataloader(), max_blocks)
    result["blocks"] = blocks.num_blocks
    if selector_form:
        ks = sorted({*SELECTOR_KS, k})
        vocab = module.drafter.draft_vocab  # the walk maps draft indices to target ids for the Markov head
        report = equivalence_report(
            blocks.base_logits, head, blocks.first_prev, blocks.hidden, blocks.teacher_logprobs, ks, blocks.valid,
            d2t=None if vocab is None else vocab.d2t,
        )  # fmt: skip
        result["selector"] = {
            "ks": list(report.ks),
            "coverage": [report.coverage[q] for q in report.ks],
            "agreement": [report.agreement[q] for q in report.ks],
            "agreed_prefix": [report.agreed_prefix[q] for q in report.ks],
            "tau_walk": [report.tau_walk[q] for q in report.ks],
            "tau_sequential": report.tau_sequential,
        }
        result["agreement_at_k"] = report.agreement[k]
        result["coverage_at_k"] = report.coverage[k]
    else:
        result["selector"] = None
        result["agreement_at_k"] = result["coverage_at_k"] = None
    if blocks.confidence_logits is not None:
        calibration = heldout_calibration(blocks)
        result["ece_before"], result["ece_after"] = calibration["ece_before"], calibration["ece_after"]
        result["temperatures"] = calibration["temperatures"]
    else:
        result["ece_before"] = result["ece_after"] = None
    return result
