"""What sampling changed in the training replies: length, the share cut at the 160-token cap, repetition (distinct
4-grams per reply) and agreement with the greedy reply of the same conversation, in the target's own tokens; into
``data_stats.json`` and the table ``data_stats.md`` beside it.

    python experiments/smollm2_sampled_regen/data_stats.py --target targets/smollm2-135m-instruct \
        --greedy assets/smollm2/regenerated-951/train-00000.jsonl assets/smollm2/regenerated-more/train-00000.jsonl \
        --sampled assets/smollm2/regenerated-sampled/train-*.jsonl --output experiments/smollm2_sampled_regen/data_stats.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from transformers import AutoTokenizer

MAX_NEW_TOKENS = 160  # the regenerations' --max_new_tokens (assets/smollm2/README.md)


def replies(paths: list[str]) -> dict[str, str]:
    """Conversation id -> the first assistant reply, in file order."""
    out = {}
    for path in paths:
        # one record per "\n" (str.splitlines would also split at U+2028 inside a reply)
        for line_no, line in enumerate(Path(path).read_text().split("\n"), 1):
            if not line:
                continue
            record = json.loads(line)
            turns = [t["value"] for t in record["conversations"] if t["from"] == "gpt"]
            if not turns:
                raise SystemExit(f"{path}:{line_no}: record {record.get('id')!r} has no assistant reply")
            out[record["id"]] = turns[0]
    return out


def distinct_4gram_share(tokens: list[int]) -> float | None:
    """Distinct 4-grams over all 4-grams of one reply (1.0: no 4-gram repeats); None below 4 tokens."""
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams) if grams else None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def summary(tokens: dict[str, list[int]]) -> dict:
    lengths = [len(t) for t in tokens.values()]
    distinct = [d for d in map(distinct_4gram_share, tokens.values()) if d is not None]
    return dict(
        replies=len(lengths), mean_reply_tokens=statistics.fmean(lengths), median_reply_tokens=statistics.median(lengths),
        share_at_token_cap=sum(n >= MAX_NEW_TOKENS for n in lengths) / len(lengths),
        mean_distinct_4gram_share=statistics.fmean(distinct),
    )  # fmt: skip


def table(result: dict) -> str:
    """The greedy and sampled summaries side by side (data_stats.md, quoted by the experiment's README)."""
    g, s = result["greedy"], result["sampled"]
    rows = [
        ("mean reply tokens", lambda x: f"{x['mean_reply_tokens']:.1f}"),
        (f"replies cut at {MAX_NEW_TOKENS} tokens", lambda x: f"{100 * x['share_at_token_cap']:.1f}%"),
        ("distinct 4-grams per reply (mean share)", lambda x: f"{x['mean_distinct_4gram_share']:.3f}"),
    ]
    lines = ["| | greedy | sampled |", "|---|---:|---:|", *(f"| {name} | {f(g)} | {f(s)} |" for name, f in rows)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target whose tokenizer counts the tokens")
    parser.add_argument("--greedy", nargs="+", required=True, help="JSONL files of the greedy regeneration")
    parser.add_argument("--sampled", nargs="+", required=True, help="JSONL files of the sampled regeneration")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    greedy, sampled = replies(args.greedy), replies(args.sampled)
    missing = sorted(set(sampled) - set(greedy))
    if missing:
        raise SystemExit(
            f"{args.sampled}: {len(missing)} sampled conversations have no greedy reply, e.g. {missing[0]}"
        )
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    greedy_tokens = {i: encode(greedy[i]) for i in sampled}  # the same conversations, in the sampled file's order
    sampled_tokens = {i: encode(t) for i, t in sampled.items()}
    prefixes = [common_prefix(greedy_tokens[i], sampled_tokens[i]) for i in sampled]
    result = dict(
        greedy=summary(greedy_tokens), sampled=summary(sampled_tokens),
        paired=dict(
            conversations=len(sampled),
            share_identical=sum(greedy_tokens[i] == sampled_tokens[i] for i in sampled) / len(sampled),
            mean_common_prefix_tokens=statistics.fmean(prefixes),
            median_common_prefix_tokens=statistics.median(prefixes),
        ),
        files=dict(greedy=args.greedy, sampled=args.sampled), tokenizer=args.target,
    )  # fmt: skip
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    Path(args.output).with_suffix(".md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    main()
