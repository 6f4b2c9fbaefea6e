"""The request path's limits (issue 58): a class map may not ask the JPEG node for far more pixels than it holds, and
a 500 tells the client nothing of what broke."""

import json

import pytest
import torch

from handlers import classmap
from handlers.jpeg import MAX_UPSCALE_PX_PER_PX, JpegHandler
from tests.conftest import make_context, status_of, with_rows
from tests.unit.test_limits import Flaky


@pytest.fixture(scope="module")
def jpeg():
    handler = JpegHandler()
    handler.initialize(make_context(None, {}))
    return handler


def test_a_class_map_claiming_far_more_pixels_than_it_holds_is_refused_naming_the_limit(jpeg):
    tiny = classmap.pack(torch.ones(1, 1, dtype=torch.uint8), 2, 5000, 5000)  # 19 bytes asking for a 25 MP encode
    at_limit = classmap.pack(torch.ones(4, 4, dtype=torch.uint8), 2, 128, 512)  # 65,536 pixels from 16: 4096 each
    over = classmap.pack(torch.ones(4, 4, dtype=torch.uint8), 2, 129, 512)
    assert len(tiny) == 19
    context = with_rows(make_context(None, {}), 3)
    out = jpeg.handle([{"body": body} for body in (tiny, at_limit, over)], context)
    assert [status_of(context, i) for i in range(3)] == [400, 200, 400]
    assert json.loads(out[0])["error"] == (
        f"output of 5000x5000 pixels from a 1x1 class map is refused: the limit is {MAX_UPSCALE_PX_PER_PX} output pixels "
        "per class-map pixel"
    )
    assert json.loads(out[2])["error"].startswith("output of 512x129 pixels from a 4x4 class map is refused: the limit is 4096")


def test_a_500_carries_torchserves_request_id_and_no_detail(caplog):
    handler = Flaky()
    handler.initialize(make_context(None, {}))
    context = with_rows(make_context(None, {}), 2)
    context.request_ids = {0: "5f1c-request-a", 1: "5f1c-request-b"}  # as TorchServe's worker sets them
    out = handler.handle([{"body": b"a"}, {"body": b"predict-bug"}], context)
    assert context.get_response_status(1) == (500, "Internal Server Error")  # the status line carries no detail either
    assert json.loads(out[1]) == {"error": "internal error (request id 5f1c-request-b)", "request_id": "5f1c-request-b"}
    assert "the batch broke" not in out[1].decode()
    assert any("5f1c-request-b" in r.getMessage() and "the batch broke" in r.getMessage() for r in caplog.records)
