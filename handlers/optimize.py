"""Model optimisations applied at load (model-config `handler.optimize`): eager, compile, int8, ipex.

- eager: the network as loaded.
- compile: torch.compile (inductor; C++ kernels on the CPU), frozen weights.
- int8: the archive's serialized file is a program quantised after training (PT2E flow for x86, built once by
  `segserve build` / `segserve optimize`, see segserve/model/quantize.py); inductor compiles it here into oneDNN's
  int8 kernels, with the passes torchao registers (torchao must be in the worker's Python).
- ipex: Intel Extension for PyTorch's optimize(), in a Python that has it (`make setup-ipex`: .venv-ipex).

A compiled network is compiled for fixed batch sizes (buckets: the powers of two below the largest batch, and
the largest): a batch runs padded to its bucket. Measured on 2 cores at batch 8: int8 with a dynamic batch
dimension ran no faster than eager (146 vs 154 img/s), with a static one at about twice eager. warm_up
compiles every bucket before the worker reports ready, so no request pays for it (the load time, `load_s` in
a bench record, does).
"""

import sys

import torch

from handlers import pinning

OPTIMIZATIONS = ("eager", "compile", "int8", "ipex")
IPEX_HINT = "run `make setup-ipex` and serve from its venv (a suite: grid.server.venv: [.venv-ipex])"


def optimise(network: torch.nn.Module, optimize: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The network to call for this optimisation (already in eval mode, on its device, in its dtype)."""
    if optimize not in OPTIMIZATIONS:
        raise ValueError(f"optimize must be one of {list(OPTIMIZATIONS)} (got {optimize!r})")
    if optimize == "eager":
        return network
    if optimize == "ipex":
        if device.type != "cpu":
            raise ValueError(f"optimize 'ipex' is for the CPU (the worker runs on {device})")
        try:
            import intel_extension_for_pytorch as ipex
        except ImportError as error:
            missing = f"intel_extension_for_pytorch is not importable in {sys.executable} ({error})"
            raise ValueError(f"optimize 'ipex': {missing}: {IPEX_HINT}") from None
        return ipex.optimize(network, dtype=dtype if dtype == torch.bfloat16 else None)
    if optimize == "int8":
        if dtype != torch.float32:
            raise ValueError(f"optimize 'int8' runs the ops it does not quantise in fp32: use precision fp32 (got {dtype})")
        try:  # registers inductor's int8 passes for x86; without them the program runs its (de)quantize ops in fp32:
            # measured no faster than eager (150 vs 148 img/s), with them 264–314 img/s (batch 8, 2 threads)
            import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer  # noqa: F401
        except ImportError as error:
            raise ValueError(f"optimize 'int8' needs torchao in {sys.executable} (pip install torchao): {error}") from None
    import torch._inductor.config as inductor_config

    # Weights become constants of the compiled graph: inductor prepacks them for oneDNN, and folds the
    # int8 program's dequantize-convolution-quantize patterns into int8 convolutions (without it they run in fp32).
    inductor_config.freezing = True
    return torch.compile(network, dynamic=False)


def compiles(optimize: str) -> bool:
    return optimize in ("compile", "int8")


def batch_buckets(optimize: str, max_rows: int) -> tuple[int, ...]:
    """The batch sizes a network is compiled for; () when it runs any size as it comes (eager, ipex)."""
    if not compiles(optimize):
        return ()
    return tuple(sorted({1 << i for i in range(max(1, max_rows).bit_length()) if 1 << i < max_rows} | {max(1, max_rows)}))


def padded_rows(rows: int, buckets: tuple[int, ...]) -> int:
    """The rows a batch of `rows` runs with: its bucket, or itself (eager, or more rows than any bucket)."""
    return next((size for size in buckets if size >= rows), rows)


def warm_up(network, batch_sizes: tuple[int, ...], example: torch.Tensor, dtype: torch.dtype) -> None:
    """Compile for each batch size now instead of on a request. `example`: one fp32 input row in the model's
    memory format. Each input is made as the handler makes a batch (an fp32 buffer allocated outside inference
    mode, cast to the model's dtype inside it): dynamo guards on the tensor's kind, and an inference-mode
    tensor here would leave every real batch to compile again (measured: 8 s on the first batch of each size)."""
    import torch._dynamo

    pinning.settle_threads_for_compiling()  # dynamo guards on the thread count: a sharing worker fixes it first
    limit = len(batch_sizes) + 8  # dynamo recompiles at most this many graphs per function before falling back
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
    for size in batch_sizes:
        batch = example.expand(size, *example.shape[1:]).contiguous(memory_format=_memory_format(example))
        with torch.inference_mode():
            network(batch.to(dtype))


# inductor's counters of the int8 patterns it rewrote (torchao's x86 passes): a convolution whose dequantize →
# conv → quantize was matched runs as a oneDNN int8 convolution; none matched means the program ran in fp32
INT8_COUNTERS = {"int8_convolutions": "qconv_weight_prepack_matcher_count", "int8_linears": "qlinear_weight_prepack_matcher_count"}


def int8_kernels() -> dict[str, int]:
    """The int8 kernels this process's compiles put in place so far (summed over its compiled graphs, one per
    batch size): {"int8_convolutions": n, "int8_linears": m}."""
    from torch._dynamo.utils import counters

    return {name: int(counters["inductor"][counter]) for name, counter in INT8_COUNTERS.items()}


def _memory_format(tensor: torch.Tensor):
    return torch.channels_last if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
