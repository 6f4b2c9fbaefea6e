"""Imported before torchvision by every handler module that uses it (segmentation, jpeg, segnet)."""

import sys
import types

import torch


def _import_torchvision_without_dynamo() -> None:
    """Import torchvision without torch._dynamo, which a worker that does not compile never uses.

    torchvision 0.29's package init imports torchvision.ops.roi_align, which imports one helper from
    torch._dynamo.utils, and with it all of torch._dynamo, sympy and torch._inductor: about 2 s of a
    worker's ~5 s start on 2 cores (every worker and every bare forward pays it). Here that one helper
    imports the real one on its first call, and torch._dynamo stays unimported until something compiles
    (torch.compile imports it then, as it would have anyway)."""
    if "torchvision" in sys.modules or "torch._dynamo" in sys.modules:
        return

    def is_compile_supported(device_type):
        from torch._dynamo.utils import is_compile_supported as real  # noqa: PLC0415 (the deferred import)

        return real(device_type)

    stand_ins = {name: types.ModuleType(name) for name in ("torch._dynamo", "torch._dynamo.utils")}
    stand_ins["torch._dynamo.utils"].is_compile_supported = is_compile_supported
    sys.modules.update(stand_ins)
    try:
        import torchvision  # noqa: F401, PLC0415
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        if torch.__dict__.get("_dynamo") is stand_ins["torch._dynamo"]:
            del torch._dynamo


_import_torchvision_without_dynamo()
