"""The vLLM side of ``serve-check``, ``serve-speedup`` and ``regenerate --engine vllm`` (``python vllm_worker.py
JOB.json`` in the vLLM interpreter; it imports vLLM, torch and safetensors only), one task per process: ``load``
(vLLM's drafter class built from the export, every parameter compared), ``serve`` (greedy ids and spec-decode
counters), ``time`` (with or without the drafter, alone then batched) and ``generate`` (one engine for a whole run,
JSON lines on stdin and stdout). Each task's function says what it returns."""

from __future__ import annotations

import json
import os
import socket
import sys

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
VERIFIER_PARAMS = ("embed_tokens.", "lm_head.")  # shared from the verifier when the export holds none
OPTIONAL_PARAMS = ("mask_embedding",)  # vLLM's override of the mask token's embedding (a mask_embedding.pt file)


def expected(name: str, tensors: dict):
    """The export tensor(s) vLLM's parameter ``name`` is loaded from: (tensor or None, export keys)."""
    import torch

    key = name.removeprefix("model.").replace("draft_id_to_target_id", "d2t")
    if key in tensors:
        return tensors[key], [key]
    for fused, parts in FUSED.items():
        if f".{fused}." in key:
            keys = [key.replace(fused, part) for part in parts]
            if all(k in tensors for k in keys):
                return torch.cat([tensors[k] for k in keys]), keys
    return None, []


def engine_args(job: dict, speculative: bool = True, **extra):
    from vllm.engine.arg_utils import EngineArgs

    config = {"model": job["export"], "method": job["method"], "num_speculative_tokens": job["num_tokens"]}
    return EngineArgs(
        model=job["target"],
        speculative_config=config if speculative else None,
        dtype=job["dtype"],
        enforce_eager=True,
        max_model_len=job["max_model_len"],
        seed=0,
        **extra,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_check(job: dict) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype

    VllmConfig._get_v1_model_runner_unsupported_features = lambda self: []  # the runner gate only
    config = engine_args(job).create_engine_config()
    draft = config.speculative_config.draft_model_config
    tensors = load_file(os.path.join(job["export"], "model.safetensors"))
    with set_current_vllm_config(config), set_default_torch_dtype(draft.dtype), torch.device("cpu"):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{free_port()}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        model_class, architecture = get_model_architecture(draft)
        model = model_class(vllm_config=config, prefix="")
        try:
            model.load_weights(iter(tensors.items()))
        except (ValueError, KeyError, AssertionError, RuntimeError) as error:
            return {"class": model_class.__name__, "architecture": architecture, "error": str(error).splitlines()[0]}
    used, compared, differ, verifier, unread = set(), 0, [], [], []
    for name, param in model.named_parameters():
        tensor, keys = expected(name, tensors)
        short = name.removeprefix("model.")
        if tensor is None and (param.numel() == 0 or short.startswith(OPTIONAL_PARAMS)):
            continue  # a rank-0 Markov head (markov_rank 0), or no mask_embedding.pt shipped
        if tensor is None:
            (verifier if short.startswith(VERIFIER_PARAMS) else unread).append(name)
            continue
        used.update(keys)
        compared += 1
        value = param.detach()
        if value.ndim and tensor.ndim and value.shape[1:] == tensor.shape[1:] and value.shape[0] > tensor.shape[0]:
            value = value[: tensor.shape[0]]  # ParallelLMHead pads its rows to a multiple of 64
        if tensor.shape != value.shape or not torch.equal(tensor.to(value.dtype), value):
            differ.append(name)
    unused = sorted(set(tensors) - used - {"t2d"})  # vLLM skips t2d (it keeps d2t)
    return {
        "class": model_class.__name__,
        "architecture": architecture,
        "compared": compared,
        "differ": differ,
        "unused": unused,
        "not_from_export": unread,
        "from_verifier": verifier,
        "hf_causal": [getattr(draft.hf_config, "is_causal", None)],
    }


def serve(job: dict) -> dict:
    from vllm import LLM, SamplingParams

    # on CPU the "gpu" memory fraction is the share of host memory vLLM reserves (KV cache included)
    memory = dict(gpu_memory_utilization=job["memory_fraction"], disable_log_stats=False)
    llm = LLM(**vars(engine_args(job, **memory)))
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    outputs = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params, use_tqdm=False)]
    return {"outputs": outputs, "counters": spec_counters(llm)}


def spec_counters(llm) -> dict:
    counters = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_"):
            key = metric.name.removeprefix("vllm:spec_decode_")
            counters[key] = list(metric.values) if hasattr(metric, "values") else int(metric.value)
    return counters


def time_generation(job: dict) -> dict:
    import time

    from vllm import LLM, SamplingParams

    memory = dict(gpu_memory_utilization=job["memory_fraction"], disable_log_stats=False)
    llm = LLM(**vars(engine_args(job, speculative=job["speculative"], **memory)))
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up: compile, allocate, first-call costs

    def timed(batch):
        start = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - start, [list(out.outputs[0].token_ids) for out in outputs]

    single = [timed([prompt]) for prompt in prompts]
    batches = {}
    for size in job["batch_sizes"]:
        runs = [timed(prompts[i : i + size]) for i in range(0, len(prompts), size)]
        batches[str(size)] = {"seconds": [s for s, _ in runs], "outputs": [o for _, outs in runs for o in outs]}
    return {
        "seconds": [s for s, _ in single],
        "outputs": [o for _, (o,) in single],
        "batches": batches,
        "counters": spec_counters(llm),
        "load_average": list(os.getloadavg()),
    }


def generate_loop(job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    protocol = os.fdopen(os.dup(1), "w")  # answers only: everything vLLM or torch prints goes to stderr
    os.dup2(2, 1)
    parallel = dict(tensor_parallel_size=job["tensor_parallel_size"], data_parallel_size=job["data_parallel_size"])
    args = EngineArgs(model=job["target"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=job["seed"],
                      gpu_memory_utilization=job["memory_fraction"], trust_remote_code=job["trust_remote_code"],
                      enforce_eager=True, **parallel)  # fmt: skip
    llm = LLM(**vars(args))
    protocol.write(json.dumps({"ready": True}) + "\n")
    protocol.flush()
    served = 0
    for line in sys.stdin:
        request = json.loads(line)
        sampling = request["sampling"] or {"temperature": 0.0}
        params = [
            SamplingParams(max_tokens=request["max_new_tokens"], stop_token_ids=request["stop_token_ids"],
                           seed=request["seed"] + i if sampling["temperature"] > 0 else None, **sampling)
            for i in range(len(request["prompts"]))
        ]  # fmt: skip
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]], params, use_tqdm=False)
        answer = {"outputs": [list(o.outputs[0].token_ids) for o in outputs]}
        answer["finish"] = [o.outputs[0].finish_reason for o in outputs]
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()
        served += len(outputs)
    return {"served": served}


def main(job_path: str) -> None:
    """Run the job's ``task`` (one per process: each sets up vLLM's distributed state) and write its result."""
    with open(job_path) as file:
        job = json.load(file)
    try:
        tasks = {"load": load_check, "serve": serve, "time": time_generation, "generate": generate_loop}
        result = tasks[job["task"]](job)
    except Exception as error:  # reported to serve-check as one line, not a traceback
        lines = [line.strip() for line in str(error).splitlines() if line.strip()][:3]  # pydantic: the field's line
        result = {"error": f"{type(error).__name__}: {' / '.join(lines)}"}
    with open(job["result"], "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(sys.argv[1])
