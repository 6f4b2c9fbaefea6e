"""The machine in the records (its CPU's identity and ISA), a watched bare forward, and the rule that a ratio is
printed as a number only when its interval is within ±15% of it."""

from pathlib import Path

import pytest
import torch

from segserve.bench.results.analysis import Pipeline, analyse
from segserve.bench.results.render import render_table
from segserve.bench.results.stats import uncertainty
from segserve.machine import identity
from segserve.model import bare

ZEN3 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC
stepping	: 1
flags		: fpu sse sse2 avx avx2 fma bmi2

processor	: 1
vendor_id	: AuthenticAMD
"""
SAPPHIRE_RAPIDS = """processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 143
model name	: Intel(R) Xeon(R) Platinum 8488C
stepping	: 8
flags		: fpu avx avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""


def test_the_cpu_is_identified_by_vendor_family_model_stepping_and_the_isa_that_int8_needs():
    zen3, spr = identity.cpu_identity(ZEN3), identity.cpu_identity(SAPPHIRE_RAPIDS)
    assert (zen3["cpu_vendor"], zen3["cpu_family"], zen3["cpu_model_number"], zen3["cpu_stepping"]) == ("AuthenticAMD", 25, 1, 1)
    assert zen3["cpu_isa"] == {"avx2": True, "avx512f": False, "avx512_vnni": False, "avx_vnni": False, "avx512_bf16": False, "amx": False}
    assert spr["cpu_isa"]["amx"] and spr["cpu_isa"]["avx512_vnni"] and spr["cpu_model_number"] == 143
    assert "family 25 model 1 stepping 1; avx2;" in identity.label({**zen3, "gpu": None})
    assert identity.differences({**zen3, "gpu": None}, {**spr, "gpu": None})[:2] == ["cpu_vendor", "cpu_family"]
    assert identity.differences({**zen3, "gpu": None}, {**zen3, "gpu": None}) == []
    # a record from before the CPU was identified is compared by what it has: the CPU's name and cores
    assert identity.differences({"cpu_model": "AMD EPYC", "cpu_cores": 2}, {**zen3, "gpu": None}) == []
    assert identity.differences({"cpu_model": "AMD EPYC", "cpu_cores": 4}, {**zen3, "gpu": None}) == ["cpu_cores"]


def test_int8_without_vnni_or_amx_is_named_before_it_is_measured():
    zen3, spr = identity.cpu_identity(ZEN3), identity.cpu_identity(SAPPHIRE_RAPIDS)
    warning = identity.int8_shortfall(zen3["cpu_isa"], zen3["cpu_vendor"])
    assert "no VNNI and no AMX" in warning and "avx2" in warning
    assert identity.int8_shortfall(spr["cpu_isa"], "GenuineIntel") is None
    assert identity.int8_shortfall({name: False for name in identity.ISA_FLAGS}, "?") is None  # not x86: nothing to say


def test_this_machine_is_identified():
    here = identity.machine()
    fields = identity.cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    assert here["cpu_cores"] >= 1 and set(here["cpu_isa"]) == set(identity.ISA_FLAGS)
    assert here["cpu_vendor"] == fields.get("vendor_id", "?") and here["cpu_isa"]["avx2"] is ("avx2" in fields.get("flags", "").split())


@pytest.mark.parametrize(
    ("value", "interval", "reasons", "printed"),
    [
        (0.80, (0.75, 0.85), [], True),  # within ±15%
        (2.1, (0.94, 3.5), [], False),  # the disturbed seg point: a factor of 3.8 wide
        (0.80, (0.79, 0.81), ["the bare forward was disturbed"], False),
        (0.80, None, [], False),  # no interval: too few windows
    ],
)
def test_a_ratio_is_a_number_only_within_15_percent_and_undisturbed(value, interval, reasons, printed):
    note = uncertainty(value, interval, reasons)
    assert (note is None) is printed
    if not printed:
        assert note.startswith("uncertain (") and all(reason in note for reason in reasons)


def test_a_disturbed_bare_forward_or_a_wide_interval_is_printed_as_uncertain_with_its_reason():
    def point(run_id, **extra):
        return {"run_id": run_id, "target": "seg", "throughput_rps": 44.5, "latency_p99_ms": 50.0, "batch_size": 8, "omp_num_threads": 2,
                "bare_forward_ips": 21.3, "ratio_bare": 2.1, "ratio_bare_ci_low": 0.94, "ratio_bare_ci_high": 3.5, **extra}  # fmt: skip

    for record, reason in ((point("seg-d", bare_disturbed=True), "bare forward was disturbed"), (point("seg-w"), "wider than ±15%")):
        rows = analyse([record], {}, "throughput_rps", [], {}).served_vs_bare
        assert rows[0]["ratio_bare"] is None and reason in rows[0]["ratio_bare_uncertain"]
        table = render_table(rows, ["run_id", "ratio_bare"])
        assert "uncertain (0.94–3.50)" in table and "| 2.1 |" not in table


def test_an_efficiency_ratio_without_windows_is_uncertain():
    records = [
        {"run_id": r, "target": t, "throughput_rps": v, "latency_p99_ms": 10.0, "batch_size": 1}
        for r, t, v in (("p", "wf", 60.0), ("a", "seg", 100.0), ("b", "jpeg", 300.0))
    ]
    row = analyse(records, {}, "throughput_rps", [], {"wf": Pipeline(("seg", "jpeg"), "seg")}).efficiency[0]
    assert row["ratio_shared"] is None and "too few windows" in row["ratio_shared_uncertain"]


class Shares:
    """Stands in for OwnSpan: others' share of the machine for each slice in turn."""

    def __init__(self, values):
        self.values = iter(values)

    def __call__(self):
        share = next(self.values)
        return type("Span", (), {"others_share": lambda _self: share})()


def test_a_disturbed_bare_slice_is_measured_again_and_a_shape_never_left_alone_says_disturbed(monkeypatch):
    network = torch.nn.Identity()
    monkeypatch.setattr(bare, "OwnSpan", Shares([0.0, 0.5, 0.0, 0.0]))
    entry = bare.forward_throughputs(network, [(1, 8, 8)], seconds=0.03, rounds=3, max_others_share=0.1)[0]
    assert (entry["disturbed"], entry["slices_discarded"], len(entry["slices_ips"])) == (False, 1, 3)
    assert entry["slices_others_cpu_pct"] == [0.0, 50.0, 0.0, 0.0] and entry["others_cpu_pct"] == 50.0
    monkeypatch.setattr(bare, "OwnSpan", Shares([0.4] * 6))
    busy = bare.forward_throughputs(network, [(1, 8, 8)], seconds=0.03, rounds=3, max_others_share=0.1, retries=3)[0]
    assert busy["disturbed"] and len(busy["slices_ips"]) == 6  # every slice kept, the shape flagged


def test_a_point_measured_in_rounds_is_the_median_of_its_rounds_with_their_spread_in_its_interval():
    from segserve.bench.run.rounds import combine_rounds

    def round_(rps, p99, **extra):
        return {"throughput_rps": rps, "latency_p99_ms": p99, "measured_window_throughputs_rps": [rps - 1, rps, rps + 1],
                "error": None, "disturbed": False, "stable": True, **extra}  # fmt: skip

    record = combine_rounds([round_(25.6, 300.0), round_(36.0, 200.0), round_(39.7, 180.0, disturbed=True)])
    assert (record["rounds"], record["throughput_rps"], record["latency_p99_ms"]) == (3, 36.0, 200.0)
    assert record["throughput_ci_low_rps"] <= 36.0 <= record["throughput_ci_high_rps"] and record["throughput_ci_low_rps"] < 30.0
    assert record["rounds_throughput_rps"] == [25.6, 36.0, 39.7] and len(record["measured_window_throughputs_rps"]) == 9
    assert record["disturbed"] is True  # any round's flag is the point's
    failed = combine_rounds([round_(30.0, 1.0), {**round_(0.0, None), "error": "RuntimeFailure: worker died"}])
    assert failed["error"] == "RuntimeFailure: worker died" and failed["rounds_throughput_rps"] == [30.0]


def test_rounds_need_a_whole_grid():
    from segserve.bench.run.suite_run import check_rounds
    from segserve.bench.suite.spec import Suite
    from segserve.errors import UsageError

    grid = Suite(name="g", targets=["seg"], inputs=[{"images": ["x"]}])
    check_rounds(grid, 3, None, None)
    searched = Suite(name="s", targets=["seg"], inputs=[{"images": ["x"]}], search={"strategy": "random", "budget": {"points": 3}})
    for suite, resume, storage in ((searched, None, None), (grid, Path("r"), None), (grid, None, "postgresql://x")):
        with pytest.raises(UsageError, match="--rounds 3"):
            check_rounds(suite, 3, resume, storage)
    with pytest.raises(UsageError, match="≥ 1"):
        check_rounds(grid, 0, None, None)


def test_a_disturbed_bare_forward_withholds_only_the_ratios_that_use_it():
    def windows(value):
        return [value * 0.99, value, value * 1.01]

    records = [
        {
            "run_id": r,
            "target": t,
            "throughput_rps": v,
            "latency_p99_ms": 10.0,
            "batch_size": 8,
            "omp_num_threads": 2,
            "measured_window_throughputs_rps": windows(v),
        }  # fmt: skip
        for r, t, v in (("p", "wf", 60.0), ("a", "seg", 100.0), ("b", "jpeg", 300.0))
    ]
    bare = [{"batch_size": 8, "threads": 2, "throughput_ips": 80.0, "slices_ips": windows(80.0), "disturbed": True}]
    row = analyse(records, {}, "throughput_rps", bare, {"wf": Pipeline(("seg", "jpeg"), "seg")}).efficiency[0]
    assert row["ratio_shared"] == pytest.approx(0.8) and row["ratio_disjoint"] == pytest.approx(0.6)  # they do not use it
    assert row["ratio_bare"] is None and "the bare forward was disturbed" in row["ratio_bare_uncertain"]
